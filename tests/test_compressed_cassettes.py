"""Compressed vcr cassettes (``x.yaml.gz``, ``.yml.bz2``, ``.yaml.xz``) import like the plain file they hold."""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import ImportFormatError
from promptcache_nb.readers import detect
from promptcache_nb.readers.vcr import VcrReader

CASSETTES = sorted((pc.data_path("logs") / "vcr").glob("*.yaml"))
COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
TOTALS = """SELECT count(*) AS requests, sum(input_tokens) AS input, sum(cache_read_input_tokens) AS read,
                   sum(cache_creation_input_tokens) AS write, sum(output_tokens) AS output, sum(cost_usd) AS cost,
                   count(DISTINCT model) AS models
            FROM turns"""


def _totals(paths: list[Path]) -> tuple[dict[str, object], int]:
    with pc.Lab(progress=False) as lab:
        res = lab.import_log(paths)
        return lab.sql(TOTALS).iloc[0].to_dict(), len(res.skipped)


@pytest.mark.parametrize("kind", sorted(COMPRESS))
def test_a_compressed_cassette_imports_like_the_plain_one(tmp_path, kind):
    assert len(CASSETTES) >= 2
    packed = []
    for i, src in enumerate(CASSETTES):
        suffix = ".yml" if i % 2 else ".yaml"  # both spellings
        dest = tmp_path / f"{src.stem}{suffix}.{kind}"
        dest.write_bytes(COMPRESS[kind](src.read_bytes()))
        assert isinstance(detect(dest), VcrReader)
        packed.append(dest)
    want, want_skipped = _totals(list(CASSETTES))
    got, got_skipped = _totals([tmp_path])  # a folder walk finds them by their suffixes
    assert want["requests"] > 0 and want["cost"] > 0
    assert got == want and got_skipped == want_skipped


def test_a_corrupt_compressed_cassette_is_one_line(tmp_path):
    bad = tmp_path / "broken.yaml.gz"
    bad.write_bytes(gzip.compress(CASSETTES[0].read_bytes())[:200])
    with pytest.raises(ImportFormatError) as err:
        list(VcrReader().read(bad))
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_the_size_limit_holds_after_decompression(tmp_path, monkeypatch):
    import promptcache_nb.readers.vcr as vcr

    packed = tmp_path / "big.yaml.gz"
    packed.write_bytes(gzip.compress(CASSETTES[0].read_bytes()))
    monkeypatch.setattr(vcr, "MAX_CASSETTE_BYTES", packed.stat().st_size + 10)  # the archive fits, its text not
    with pytest.raises(ImportFormatError, match="limit decompressed; split it"):
        list(VcrReader().read(packed))
