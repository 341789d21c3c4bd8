"""The config: its fields are validated settings and nothing else, its policy
fields are protocol fields, and its codec names are the build's codec set."""
from __future__ import annotations

import pytest

from zipccl_fsdp import calibration as Cal
from zipccl_fsdp.config import ZipCCLConfig


def test_config_validates_policy_fields():
    with pytest.raises(ValueError, match="policy"):
        ZipCCLConfig(policy="sometimes")
    with pytest.raises(ValueError, match="link_gbps"):
        ZipCCLConfig(link_gbps=0)
    with pytest.raises(ValueError, match="pipeline_pieces"):
        ZipCCLConfig(pipeline_pieces=-1)
    a, b = ZipCCLConfig(policy="adaptive"), ZipCCLConfig(policy="adaptive", link_gbps=1.0)
    assert a.protocol_fields() != b.protocol_fields()


def test_config_validation():
    with pytest.raises(ValueError, match="codec"):
        ZipCCLConfig(codec="zstd")
    with pytest.raises(ValueError, match="min_bytes"):
        ZipCCLConfig(min_bytes=-1)
    with pytest.raises(ValueError, match="backend"):
        ZipCCLConfig(backend="cuda")
    with pytest.raises(ValueError, match="unsupported_dtype"):
        ZipCCLConfig(unsupported_dtype="ignore")
    with pytest.raises(ValueError, match="compress_all_gather"):
        ZipCCLConfig(compress_all_gather=1)


def test_configs_hold_settings_only():
    import dataclasses

    from zipccl_fsdp.config import DEFAULT_CONFIG
    for f in dataclasses.fields(DEFAULT_CONFIG):
        assert f.init, f"{f.name}: a field the user does not set"
        value = getattr(DEFAULT_CONFIG, f.name)
        assert value is None or type(value) in (str, int, float, bool), (f.name, value)
    assert set(vars(DEFAULT_CONFIG)) == {f.name for f in dataclasses.fields(DEFAULT_CONFIG)}
    assert DEFAULT_CONFIG == ZipCCLConfig() and hash(DEFAULT_CONFIG) == hash(ZipCCLConfig())


def test_codec_names_are_the_build_codec_set():
    from typing import get_args

    from zipccl_fsdp import codec
    from zipccl_fsdp.config import CodecName
    assert get_args(CodecName) == ("auto", *codec.CODECS)
    assert Cal.codecs(ZipCCLConfig()) == tuple(c for c in codec.CODECS if c != "raw")
    assert Cal.codecs(ZipCCLConfig(codec="fixed3")) == ("fixed3",)
