"""own/CashMachine-v0: withdraw cash at a cash machine, one screen after the other.

An environment written outside the library as a new user would, to test the
generic CPU recipe on an env it was not tuned on: 5-10 tool turns, 40-80
action tokens in a solved episode (the oracle's: 6 turns, 49 tokens of the
tiny model's tokenizer), a perfect oracle. Unlike a pick list or a form, it is
a fixed protocol whose every step needs a value from another place: the card
number and the amount from the first message, the PIN from a note, the
account's number from the account screen, a code from the last one.

    user:  You are at a cash machine with card 50318842. Withdraw 140 from your
           savings account: insert the card, enter the PIN written on the note in
           your wallet, choose the account, withdraw the amount and confirm it.
    agent: insert(50318842)   tool: Card 50318842 accepted. Enter your PIN.
    agent: note()             tool: The note says: PIN 4821.
    agent: pin(4821)          tool: PIN accepted. Your accounts: checking 503118,
                                    savings 720945, travel 118306. Choose an account by its
                                    number.
    agent: account(720945)    tool: Account 720945 (savings), balance 1260. Enter an amount.
    agent: withdraw(140)      tool: Withdraw 140 from account 720945? Confirm with code 3981.
    agent: confirm(3981)      -> reward 1 when it paid the amount asked from the account asked

The machine only knows the card and its PIN: it pays any amount the balance
covers from any of the card's accounts, so a wrong account or amount is
rewarded 0 only when it is confirmed (until then, choosing again replaces it).
"""

import re

import sao_gym
from sao_gym.tools import ToolEnv, ToolResult, tool

KINDS = ("checking", "savings", "travel", "joint")


def _number(value) -> str:
    """An argument as the short text an observation may quote."""
    return str(value).strip()[:12]


class CashMachineEnv(ToolEnv):
    """Insert the card, read the PIN, enter it, choose the account, withdraw, confirm."""

    def __init__(self, accounts: int = 3):
        super().__init__()
        if not isinstance(accounts, int) or not 2 <= accounts <= len(KINDS):
            raise ValueError(f"accounts must be an int in [2, {len(KINDS)}], got {accounts!r}")
        self.accounts = accounts

    async def on_reset(self, options):
        rng = self.np_random
        kinds = KINDS[:self.accounts]
        numbers = [int(n) for n in rng.choice(range(100000, 1000000), size=len(kinds),
                                              replace=False)]
        kind = str(rng.choice(kinds))
        amount = 10 * int(rng.integers(10, 100))
        balances = {k: 10 * int(rng.integers(1, 200)) for k in kinds}
        balances[kind] = amount + 10 * int(rng.integers(0, 200))
        card, pin = int(rng.integers(10**7, 10**8)), int(rng.integers(1000, 10000))
        prompt = (f"You are at a cash machine with card {card}. Withdraw {amount} from your "
                  f"{kind} account: insert the card, enter the PIN written on the note in your "
                  "wallet, choose the account, withdraw the amount and confirm it.")
        self.task = {"id": f"atm-{card}-{kind}-{amount}", "prompt": prompt, "card": card,
                     "pin": pin, "kind": kind, "amount": amount,
                     "accounts": dict(zip(kinds, numbers)), "balances": balances}
        self.inserted = self.unlocked = False
        self.chosen: str | None = None  # the chosen account's kind
        self.pending: tuple[int, str] | None = None  # (amount, confirmation code)
        return [{"role": "user", "content": prompt}], {}

    def _screen(self) -> str:
        """What the machine asks for now."""
        if not self.inserted:
            return "Insert your card."
        if not self.unlocked:
            return "Enter your PIN."
        if self.chosen is None:
            return "Choose an account by its number."
        if self.pending is None:
            return "Enter an amount."
        amount, code = self.pending
        return (f"Withdraw {amount} from account {self.task['accounts'][self.chosen]}? "
                f"Confirm with code {code}.")

    @tool(description="Insert a card into the machine.", parameters={
        "type": "object", "properties": {"card": {"type": "integer"}}, "required": ["card"],
        "additionalProperties": False})
    async def insert(self, card: int):
        if self.inserted:
            return f"Error: a card is in the machine already. {self._screen()}"
        if _number(card) != str(self.task["card"]):
            return f"Error: card {_number(card)} is not in your wallet. {self._screen()}"
        self.inserted = True
        return f"Card {card} accepted. {self._screen()}"

    @tool(description="Read the note in your wallet.",
          parameters={"type": "object", "properties": {}, "additionalProperties": False})
    async def note(self):
        return f"The note says: PIN {self.task['pin']}."

    @tool(description="Enter the card's PIN.", parameters={
        "type": "object", "properties": {"pin": {"type": "integer"}}, "required": ["pin"],
        "additionalProperties": False})
    async def pin(self, pin: int):
        if not self.inserted or self.unlocked:
            return f"Error: no PIN is asked for now. {self._screen()}"
        if _number(pin) != str(self.task["pin"]):
            return f"Error: wrong PIN. {self._screen()}"
        self.unlocked = True
        listed = ", ".join(f"{k} {n}" for k, n in self.task["accounts"].items())
        return f"PIN accepted. Your accounts: {listed}. {self._screen()}"

    @tool(description="Choose one of the card's accounts by its number.", parameters={
        "type": "object", "properties": {"account": {"type": "integer"}},
        "required": ["account"], "additionalProperties": False})
    async def account(self, account: int):
        if not self.unlocked:
            return f"Error: no account can be chosen yet. {self._screen()}"
        kind = next((k for k, n in self.task["accounts"].items() if str(n) == _number(account)),
                    None)
        if kind is None:
            return f"Error: account {_number(account)} is not on this card. {self._screen()}"
        self.chosen, self.pending = kind, None
        return (f"Account {self.task['accounts'][kind]} ({kind}), balance "
                f"{self.task['balances'][kind]}. {self._screen()}")

    @tool(description="Ask to withdraw an amount from the chosen account.", parameters={
        "type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"],
        "additionalProperties": False})
    async def withdraw(self, amount: int):
        if self.chosen is None:
            return f"Error: choose an account first. {self._screen()}"
        try:
            value = int(amount)
        except (TypeError, ValueError):
            value = 0
        if value <= 0 or value % 10:
            return (f"Error: {_number(amount)} cannot be paid: the machine pays positive "
                    f"multiples of 10. {self._screen()}")
        if value > self.task["balances"][self.chosen]:
            return (f"Error: the balance of account {self.task['accounts'][self.chosen]} is "
                    f"{self.task['balances'][self.chosen]}. {self._screen()}")
        self.pending = (value, str(int(self.np_random.integers(1000, 10000))))
        return self._screen()

    @tool(description="Confirm the withdrawal with the code shown. This ends the episode.",
          parameters={"type": "object", "properties": {"code": {"type": "integer"}},
                      "required": ["code"], "additionalProperties": False})
    async def confirm(self, code: int):
        if self.pending is None:
            return f"Error: nothing to confirm. {self._screen()}"
        if _number(code) != self.pending[1]:
            return f"Error: wrong code. {self._screen()}"
        amount = self.pending[0]
        ok = self.chosen == self.task["kind"] and amount == self.task["amount"]
        return ToolResult(f"Paid {amount} from account {self.task['accounts'][self.chosen]}. "
                          "Take your card.", terminated=True, reward=float(ok))


def oracle(messages, task):
    """The step the machine's last screen asks for, with the value it needs."""
    last = (messages[-1].get("content") or "") if messages[-1].get("role") == "tool" else ""
    code = re.search(r"Confirm with code (\d+)\.", last)
    if code:
        return f"confirm({code[1]})"
    if "Enter an amount." in last:
        return f"withdraw({task['amount']})"
    if "Choose an account by its number." in last:
        return f"account({task['accounts'][task['kind']]})"
    pin = re.search(r"The note says: PIN (\d+)\.", last)
    if pin:
        return f"pin({pin[1]})"
    return "note()" if "Enter your PIN." in last else f"insert({task['card']})"


sao_gym.register("own/CashMachine-v0", CashMachineEnv, max_episode_steps=10, oracle=oracle)
