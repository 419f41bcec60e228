"""compile() takes a CompileOptions (options.py), keywords replacing its fields; each field is
checked when the options are made, so the Python API, the CLI and the budget search share
one set of defaults and errors."""
import dataclasses
import inspect

import numpy as np
import pytest

import microtrain
from microtrain import CompileOptions

import models


def test_options_and_keywords_give_the_same_plan():
    m = models.cnn()
    a = microtrain.compile(m, CompileOptions(lr=0.05, momentum=0.9, update="full"))
    b = microtrain.compile(m, lr=0.05, momentum=0.9, update="full")
    c = microtrain.compile(m, CompileOptions(lr=0.05, update="full"), momentum=0.9)   # keywords over options
    assert a.data == b.data == c.data
    assert a.data != microtrain.compile(m, update="full").data    # the options reach the plan


def test_compile_takes_options_not_two_dozen_keywords():
    params = inspect.signature(microtrain.compile).parameters
    assert list(params)[:2] == ["model", "options"] and len(params) <= 5, list(params)
    assert len(dataclasses.fields(CompileOptions)) >= 20


def test_unknown_option_names_the_options():
    with pytest.raises(TypeError, match=r"unknown compile option lrr; the options are: update, scheme, loss, lr"):
        microtrain.compile(models.mlp(), lrr=0.1)
    with pytest.raises(TypeError, match="options must be a microtrain.CompileOptions, got dict"):
        microtrain.compile(models.mlp(), {"lr": 0.1})


@pytest.mark.parametrize("field,value,message", [
    ("lr", -1, "lr must be a finite number >= 0"),
    ("momentum", 1.0, "momentum must be below 1"),
    ("batch", 0, "batch must be a whole number from 1 to 65535"),
    ("loss", "hinge", "unknown loss 'hinge'"),
    ("stream_window", 512, "with stream=True; got 512 without stream=True"),
])
def test_a_bad_field_is_refused_when_the_options_are_made(field, value, message):
    with pytest.raises(ValueError, match=message):
        CompileOptions(**{field: value})


def test_calibration_without_quantize_is_refused():
    """Calibration samples only set int8 scales: given without quantize='int8' they used to be
    ignored without a word."""
    with pytest.raises(ValueError, match="calibration samples are for quantize='int8'"):
        microtrain.compile(models.mlp(), calibration=np.zeros((4, 6), np.float32))


def test_options_are_frozen_and_normalised():
    o = CompileOptions(lr="0.5")
    assert o.lr == 0.5 and isinstance(o.lr, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.lr = 0.1
    assert CompileOptions.of(o, batch=4).batch == 4 and o.batch == 1
