"""`--router-option ROUTER.FIELD=VALUE`: each value typed as its field's default and set on the
router's own Options; every bad spec one error naming it, before any run."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.router.llmd import LLMDOptions
from radixkv.router.options import parse_router_options
from radixkv.router.radixkv import RadixKVOptions


def test_values_take_their_fields_types_on_the_routers_defaults():
    got = parse_router_options(["radixkv.work_weight=8", "radixkv.load_window=60",
                                "radixkv-fit.fit_window=64", "radixkv-fit.fit_tie=0",
                                "llm-d-precise.queue_weight=1"],
                               ["radixkv", "radixkv-fit", "llm-d-precise", "round-robin"])
    assert got == {"radixkv": RadixKVOptions(work_weight=8.0, load_window=60.0),
                   "radixkv-fit": RadixKVOptions(fit=True, fit_window=64, fit_tie=0.0),
                   "llm-d-precise": LLMDOptions(queue_weight=1.0)}
    assert type(got["radixkv-fit"].fit_window) is int
    assert parse_router_options(["radixkv.fit=yes"], ["radixkv"])["radixkv"].fit is True
    assert parse_router_options([], ["radixkv"]) == {}


@pytest.mark.parametrize("spec, message", [
    ("radixkv.work_weight", "expected ROUTER.FIELD=VALUE"),
    ("work_weight=3", "expected ROUTER.FIELD=VALUE"),
    ("dynamo-kv.router_temperature=1", "router 'dynamo-kv' is not among --router (radixkv, "
                                       "round-robin)"),
    ("round-robin.weight=1", "router 'round-robin' takes no options"),
    ("radixkv.work_wieght=3", "router 'radixkv' has no option 'work_wieght'; its options: "
                              "work_weight, decode_weight, fit"),
    ("radixkv.work_weight=lots", "'lots' is not a float"),
    ("radixkv.fit=maybe", "'maybe' is not true or false"),
    ("radixkv.work_weight=-1", "radixkv work_weight must be a finite number >= 0, got -1.0"),
    ("radixkv.load_window=0", "radixkv load_window must be a positive number"),
])
def test_a_bad_spec_is_one_error_naming_it(spec, message):
    with pytest.raises(ValueError, match="--router-option") as e:
        parse_router_options([spec], ["radixkv", "round-robin"])
    assert message in str(e.value)


def test_a_field_set_twice_is_refused():
    with pytest.raises(ValueError, match="radixkv.work_weight is set twice"):
        parse_router_options(["radixkv.work_weight=1", "radixkv.work_weight=2"], ["radixkv"])


def test_radixkv_fit_refuses_to_lose_its_fit_before_any_run():
    with pytest.raises(ValueError, match="--router-option: router 'radixkv-fit' fits its TTFT"):
        parse_router_options(["radixkv-fit.fit=false"], ["radixkv-fit"])


def test_cluster_runs_each_router_on_its_options_and_records_them(tmp_path, capsys):
    def small(workers: int) -> list[str]:
        return ["cluster", "support", "--users", "8", "--turns", "2", "--replicas", "2",
                "--workers", str(workers), "--router", "radixkv", "llm-d-precise"]
    tune = ["--router-option", "radixkv.work_weight=1000", "--router-option",
            "radixkv.load_window=5"]
    plain, tuned, pooled = tmp_path / "plain.json", tmp_path / "tuned.json", tmp_path / "pool.json"
    assert main(small(1) + ["--json", str(plain)]) == 0
    assert main(small(1) + tune + ["--json", str(tuned)]) == 0
    assert main(small(2) + tune + ["--json", str(pooled)]) == 0     # through a process pool
    a, b, c = (json.loads(p.read_text()) for p in (plain, tuned, pooled))
    assert a["router_options"] == {}
    assert b["router_options"] == c["router_options"] == {
        "radixkv": dict(RadixKVOptions(work_weight=1000.0, load_window=5.0).__dict__)}
    assert a["results"][1] == b["results"][1]          # llm-d-precise: untouched
    # radixkv never recomputes a held prefix elsewhere: more hits, all on one replica
    assert (a["results"][0]["prefill_tokens"], b["results"][0]["prefill_tokens"]) == (10_736,
                                                                                     10_224)
    assert b["results"][0]["imbalance"] == 2.0
    assert b["results"] == c["results"]
    capsys.readouterr()
    assert main(small(1) + ["--router-option", "radixkv.nope=1"]) == 2
    err = capsys.readouterr().err
    assert "router 'radixkv' has no option 'nope'" in err and err.count("\n") == 1
