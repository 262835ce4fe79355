"""Tools `parley mcp serve` offers in tests/sdk/test_mcp_serve.py (``tests.sdk.mcp_serve_tools:TOOLS``)."""

from __future__ import annotations

from typing import Literal

from parley import tool
from parley.protocol.envelope import ImagePart

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d4944415478da63646060f80f00"
    "0104010068e6a3e10000000049454e44ae426082"
)


@tool
def convert(amount: float, unit: Literal["km", "mi"]) -> str:
    """Convert a distance between km and miles.

    Args:
        amount: The distance.
        unit: The unit `amount` is in.
    """
    return f"{amount * 0.621371:.2f} mi" if unit == "km" else f"{amount / 0.621371:.2f} km"


@tool(needs_approval=lambda args: args["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an order (over 100 needs a human)."""
    return f"refunded {amount} on {order_id}"


@tool
def badge() -> list[object]:
    """A tiny badge image with a caption."""
    return ["the badge:", ImagePart.from_bytes(PNG_1X1, "image/png")]


@tool
def explode() -> str:
    """Always fails."""
    raise ValueError("kaboom")


@tool(deferred=True)
def ask_human(question: str) -> str:
    """Answered by a person (never offered over MCP)."""
    return ""


TOOLS = [convert, refund, badge, explode, ask_human]
