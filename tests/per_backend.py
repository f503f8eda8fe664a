"""Backend-specific expectations in the tests, stated for every backend at once.

The tests run once per Keras backend (`KERAS_BACKEND`: tensorflow, jax, torch). Where what a
test expects differs by backend - a keyword name, a shape, which functions to patch, how a
process is launched - it names the value for each of the three backends in one call:

    mask_keyword = per_backend(tensorflow="mask", jax="mask", torch="attn_mask")

instead of branching by hand (`x if keras.backend.backend() == "torch" else y`). All three
values are required, so a test never gives one backend a value by omission: whoever adds a
backend-specific expectation states what every backend should do.

A value may be a function that the caller then calls, so that code which imports one backend's
package (torch, jax, tensorflow) runs on that backend only:

    for module, name in per_backend(torch=_torch_sdpa, jax=list, tensorflow=list)():
        ...  # patch the torch functions on torch; nothing on the others

A check that applies to some backends only, and has nothing to say on the others, is a test of
its own marked `@pytest.mark.backends(...)` (tests/conftest.py): it is deselected where it does
not apply, and the report says so.
"""

import keras


def per_backend(*, tensorflow, jax, torch):
    """The value given for the current `KERAS_BACKEND`.

    Keyword-only and all required: every test that expects something backend-specific
    states it for every backend (no silent default for a backend a branch forgot).
    """
    values = {"tensorflow": tensorflow, "jax": jax, "torch": torch}
    return values[keras.config.backend()]
