"""Tests of the applications (the scripts under applications/).

An application is backend-independent Python over the library. Each application's main path
runs on every backend; its other paths run on one backend each (marker
`backends(..., reason=ONE_BACKEND)`), since every library path they drive is tested on every
backend in tests/models, tests/test_callbacks.py and tests/test_multiprocess.py. That backend
is mostly torch, which builds and steps a tiny model several times faster than TensorFlow's
and JAX's compiled steps; a few paths run on JAX (SWAG, NER, GLUE over two processes) or
TensorFlow (the LSTM tagger, pretraining over two processes), so that every backend runs some.
"""

ONE_BACKEND = (
    "Application logic, run on one backend (tests/applications/__init__.py says why); the "
    "library paths it drives are tested on every backend"
)
