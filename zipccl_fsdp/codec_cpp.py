"""Placeholder until the C++ CPU backend lands."""


def available() -> bool:
    return False
