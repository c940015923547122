"""own/Signup-v0: fill in a customer's sign-up form field by field, then submit it.

An environment written outside the library as a new user would, to test the
generic CPU recipe on an env it was not tuned on: 5-10 tool turns, 40-80
action tokens in a solved episode, a perfect oracle. Unlike a chain of
lookups, every value is copied from the first message, further back each turn.

    user:  Sign up this customer: name Ada, age 31, city Oslo, plan gold, team red,
           pin 4821. Set each field in turn, then submit the form.
    agent: set(name, Ada)     tool: ok: name = Ada. Next: age.
    ...
    agent: submit()           -> reward 1 when every field is right
"""

import re

import sao_gym
from sao_gym.tools import ToolEnv, ToolResult, tool

NAMES = ("Ada", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lou",
         "Max", "Ned", "Oda", "Pam")
CITIES = ("Oslo", "Rome", "Lima", "Kyiv", "Doha", "Bern", "Riga", "Baku", "Nice", "Cork")
PLANS = ("basic", "silver", "gold", "family")
TEAMS = ("red", "blue", "green", "gray")
FIELDS = ("name", "age", "city", "plan", "team", "pin")


class SignupEnv(ToolEnv):
    """Set the form's fields in the order asked (``set(field, value)``), then ``submit()``."""

    def __init__(self, fields: int = 6):
        super().__init__()
        if not 2 <= fields <= len(FIELDS):
            raise ValueError(f"fields must be in [2, {len(FIELDS)}], got {fields}")
        self.fields = FIELDS[:fields]

    async def on_reset(self, options):
        rng = self.np_random
        values = {"name": str(rng.choice(NAMES)), "age": str(int(rng.integers(18, 91))),
                  "city": str(rng.choice(CITIES)), "plan": str(rng.choice(PLANS)),
                  "team": str(rng.choice(TEAMS)), "pin": str(int(rng.integers(1000, 10000)))}
        values = {f: values[f] for f in self.fields}
        self.task = {"id": "signup-" + "-".join(values.values()), "values": values}
        self.form: dict[str, str] = {}
        listed = ", ".join(f"{f} {v}" for f, v in values.items())
        prompt = (f"Sign up this customer: {listed}. Set each field in turn, then submit "
                  "the form.")
        return [{"role": "user", "content": prompt}], {}

    def _next(self) -> str:
        left = [f for f in self.fields if f not in self.form]
        return f"Next: {left[0]}." if left else "All set: submit the form."

    @tool(description="Set a field of the form.", parameters={
        "type": "object", "properties": {"field": {"type": "string"},
                                         "value": {"type": "string"}},
        "required": ["field", "value"], "additionalProperties": False})
    async def set(self, field: str, value: str):
        field, value = str(field).strip().lower(), str(value).strip()
        want = [f for f in self.fields if f not in self.form]
        if not want or field != want[0]:
            return f"Error: not that field now. {self._next()}"
        if value != self.task["values"][field]:
            return f"Error: that is not the customer's {field}. {self._next()}"
        self.form[field] = value
        return f"ok: {field} = {value}. {self._next()}"

    @tool(description="Submit the form. This ends the episode.",
          parameters={"type": "object", "properties": {}, "additionalProperties": False})
    async def submit(self):
        ok = self.form == self.task["values"]
        return ToolResult("Signed up." if ok else "Rejected: the form is incomplete.",
                          terminated=True, reward=float(ok))


def oracle(messages, task):
    """The next field the form asks for, with the customer's value; submit when all are set."""
    last = messages[-1].get("content") or ""
    asked = re.search(r"Next: (\w+)\.", last)
    field = asked[1] if asked else (None if "All set" in last else next(iter(task["values"])))
    return "submit()" if field is None else f"set({field}, {task['values'][field]})"


sao_gym.register("own/Signup-v0", SignupEnv, max_episode_steps=10, oracle=oracle)
