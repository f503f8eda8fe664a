"""Reads of checkpoint config files: JSON with the file named in errors, typed values naming the
key."""

import json
from pathlib import Path


def read_json(path):
    """The JSON value in the file `path`; FileNotFoundError / ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Missing {path.name} in {path.parent}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


def config_int(config, key, source, default=None):
    """`config[key]` as an int; a ValueError naming `key` and `source` unless it is an integer."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**31:
            return int(value)
        raise ValueError(
            f"{source}: {key!r} must be an integer. Received: {key}={value!r} "
            f"({type(value).__name__})"
        )
    return value


def config_float(config, key, source, default=None):
    """`config[key]` as a float; a ValueError naming `key` and `source` unless it is a number."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"{source}: {key!r} must be a number. Received: {key}={value!r} "
            f"({type(value).__name__})"
        )
    return float(value)
