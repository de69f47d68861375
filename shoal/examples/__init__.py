"""Example programs that ship with Shoal, each with the data that goes with it:

- `w3`: the iterative-retrieval benchmark job (IRCoT-style hops over token prompts).
"""
