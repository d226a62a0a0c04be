"""The README's pictures: drawn by the benchmarks from their JSON (benchmarks/pictures.py),
committed next to it, and redrawn the same from the committed JSON."""
import importlib.util
import json
import os
import re
import struct

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _load(name):
    spec = importlib.util.spec_from_file_location(
        "bench_" + name, os.path.join(ROOT, "benchmarks", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pictures = _load("pictures")


def _png_size(path):
    """(width, height) of a PNG, from its header."""
    with open(path, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "%s is not a PNG" % path
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("name", sorted(pictures.DRAW))
def test_each_picture_is_committed_and_redrawn_from_its_json(name, tmp_path):
    committed = os.path.join(RESULTS, name + ".png")
    assert os.path.exists(committed), "run: .venv/bin/python benchmarks/pictures.py " + name
    with open(os.path.join(RESULTS, name + ".json")) as handle:
        payload = json.load(handle)
    drawn = pictures.draw(name, payload, str(tmp_path))
    assert drawn == str(tmp_path / (name + ".png"))
    assert _png_size(drawn) == _png_size(committed)
    assert os.path.getsize(drawn) > 10000     # a picture, not an empty canvas


def test_the_readme_shows_every_picture():
    readme = open(os.path.join(ROOT, "README.md")).read()
    shown = set(re.findall(r"!\[[^\]]*\]\(benchmarks/results/(\w+)\.png\)", readme))
    assert shown == set(pictures.DRAW)


def test_writing_results_draws_the_picture(tmp_path):
    """The benchmark draws its picture where it writes its JSON (common.write_results)."""
    common = _load("common")
    with open(os.path.join(RESULTS, "pipeline.json")) as handle:
        payload = json.load(handle)
    paths = common.write_results(str(tmp_path), "pipeline", payload, "# table")
    assert [os.path.basename(p) for p in paths] == ["pipeline.json", "pipeline.md",
                                                    "pipeline.png"]
    assert common.write_results(str(tmp_path), "split", {}, "# table")[-1].endswith("split.md")
    assert pictures.draw("split", {}, str(tmp_path)) is None
