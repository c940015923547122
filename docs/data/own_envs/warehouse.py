"""own/Warehouse-v0: pick an order's items from their shelves, then ship it.

An environment written outside the library as a new user would, to test the
generic CPU recipe on an env it was not tuned on: 5-10 tool turns, 40-80
action tokens in a solved episode, a perfect oracle.

    user:  Order 4821: pick apple, pear, plum, fig. Find each item's shelf, pick
           it from there, then ship the order.
    agent: find(apple)        tool: apple is on shelf 37.
    agent: pick(37)           tool: Picked apple. Still to pick: pear, plum, fig.
    ...
    agent: ship(4821)         -> reward 1 when every item was picked
"""

import re

import sao_gym
from sao_gym.tools import ToolEnv, ToolResult, tool

ITEMS = ("apple", "pear", "plum", "fig", "lemon", "melon", "grape", "peach", "mango", "kiwi",
         "onion", "leek", "bean", "rice", "salt", "honey", "bread", "cheese", "butter", "milk")


class WarehouseEnv(ToolEnv):
    """Find each item's shelf, pick it, ship the order; 2 x items + 1 turns when solved."""

    def __init__(self, items: int = 4):
        super().__init__()
        if not 1 <= items <= 8:
            raise ValueError(f"items must be in [1, 8], got {items}")
        self.items = items

    async def on_reset(self, options):
        rng = self.np_random
        names = [str(x) for x in rng.choice(ITEMS, size=self.items, replace=False)]
        shelves = [int(x) for x in rng.choice(range(10, 100), size=self.items, replace=False)]
        order = int(rng.integers(1000, 10000))
        self.task = {"id": f"order-{order}-{'-'.join(names)}", "order": order,
                     "shelves": dict(zip(names, shelves)), "items": names}
        self.picked: list[str] = []
        prompt = (f"Order {order}: pick {', '.join(names)}. Find each item's shelf, pick it "
                  "from there, then ship the order.")
        return [{"role": "user", "content": prompt}], {}

    def _left(self) -> str:
        left = [n for n in self.task["items"] if n not in self.picked]
        return f"Still to pick: {', '.join(left)}." if left else "All picked: ship the order."

    @tool(description="Find the shelf an item is on.", parameters={
        "type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"],
        "additionalProperties": False})
    async def find(self, item: str):
        item = str(item).strip().lower()
        if item not in self.task["shelves"]:
            return f"Error: {item[:16]} is not in this order. {self._left()}"
        return f"{item} is on shelf {self.task['shelves'][item]}."

    @tool(description="Pick the order's item from a shelf.", parameters={
        "type": "object", "properties": {"shelf": {"type": "integer"}}, "required": ["shelf"],
        "additionalProperties": False})
    async def pick(self, shelf: int):
        for name, where in self.task["shelves"].items():
            if str(where) == str(shelf).strip() and name not in self.picked:
                self.picked.append(name)
                return f"Picked {name}. {self._left()}"
        return f"Error: shelf {str(shelf)[:8]} holds nothing left to pick. {self._left()}"

    @tool(description="Ship the order. This ends the episode.", parameters={
        "type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"],
        "additionalProperties": False})
    async def ship(self, order: int):
        ok = str(order).strip() == str(self.task["order"]) and len(self.picked) == self.items
        return ToolResult("Shipped." if ok else "Not shipped: the order is wrong or incomplete.",
                          terminated=True, reward=float(ok))


def oracle(messages, task):
    """Find the next unpicked item, pick it from the shelf just found; ship when done."""
    picked = set()
    for m in messages:
        if m.get("role") == "tool":
            picked.update(re.findall(r"^Picked (\w+)\.", m["content"]))
    last = messages[-1].get("content") or ""
    found = re.match(r"(\w+) is on shelf (\d+)\.", last)
    if found and found[1] not in picked:
        return f"pick({found[2]})"
    left = [n for n in task["items"] if n not in picked]
    return f"find({left[0]})" if left else f"ship({task['order']})"


sao_gym.register("own/Warehouse-v0", WarehouseEnv, max_episode_steps=12, oracle=oracle)
