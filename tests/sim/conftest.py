from __future__ import annotations

import pytest

from radixkv.shapes import get_model_config
from radixkv.sim.profile import Profile, fit
from radixkv.sim.specs import ModelSpec


@pytest.fixture
def profile_factory():
    def make(samples):
        margs = get_model_config("tiny-llama")
        coef, res = fit(ModelSpec(margs, dtype_bytes=4), samples)
        return Profile(model=margs, dtype="float32", dtype_bytes=4, device="cpu",
                       device_name="test", backend="sdpa", machine={"host": "test"},
                       grid={"repeats": 1}, coefficients=coef, residuals=res,
                       samples=tuple(samples))
    return make
