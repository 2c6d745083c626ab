"""numpy random Generators as plain arrays, so that checkpoints stay HDF5 (no pickle).

A PCG64 state holds 128-bit integers that no numpy integer dtype can hold, so the state
travels as the ASCII bytes of its JSON text: a uint8 array that any bit generator fits in.
"""

from __future__ import annotations

import json

import numpy as np

#: Bit generators a saved state may name (looked up by name, never executed).
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def generator_state_to_array(rng: np.random.Generator) -> np.ndarray:
    """``rng``'s bit-generator state as a uint8 array (the bytes of its JSON text)."""
    text = json.dumps(rng.bit_generator.state)
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8).copy()


def _decode(state: np.ndarray) -> dict:
    return json.loads(bytes(np.asarray(state, dtype=np.uint8)).decode("ascii"))


def generator_state_from_array(rng: np.random.Generator, state: np.ndarray) -> None:
    """Restore into ``rng`` (in place) a state written by `generator_state_to_array`."""
    rng.bit_generator.state = _decode(state)


def generator_from_array(state: np.ndarray) -> np.random.Generator:
    """A new Generator continuing a state written by `generator_state_to_array` (or by the
    environments' earlier encoding: PCG64 as 6 uint64 words, which older checkpoints hold)."""
    state = np.asarray(state)
    if state.dtype == np.uint64 and state.shape == (6,):
        return _legacy_pcg64(state)
    decoded = _decode(state)
    name = decoded["bit_generator"]
    if name not in _BIT_GENERATORS:
        raise ValueError(f"unknown bit generator {name!r} in a saved random state")
    rng = np.random.Generator(getattr(np.random, name)())
    rng.bit_generator.state = decoded
    return rng


def _legacy_pcg64(words: np.ndarray) -> np.random.Generator:
    """PCG64 from [state hi, state lo, inc hi, inc lo, has_uint32, uinteger]."""
    v = [int(x) for x in words]
    bit_generator = np.random.PCG64()
    bit_generator.state = {"bit_generator": "PCG64",
                           "state": {"state": (v[0] << 64) | v[1], "inc": (v[2] << 64) | v[3]},
                           "has_uint32": v[4], "uinteger": v[5]}
    return np.random.Generator(bit_generator)
