"""`roofline ui` over real HTTP on loopback: the JSON API returns exactly the CLI's documents,
bad input is a 4xx with the CLI's one paragraph, and the server survives a bounded load test."""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.web.documents import has_command

SMALL = {"model": "tiny-llama", "system": "tpu-v5e:4x4"}
HF = Path(__file__).parents[1] / "data" / "hf" / "qwen3-0.6b.json"


AUTH: dict[str, str] = {}  # the served app's token header (set by the autouse fixture)


@pytest.fixture(autouse=True)
def _auth(ui_token):
    AUTH["Authorization"] = f"token {ui_token}"


def get(base: str, path: str, params: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    req = urllib.request.Request(url, headers=dict(AUTH))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def cli_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def without_time(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "search_time_s"}


def test_api_train_is_the_cli_document(ui_url, capsys):
    params = {**SMALL, "seq": "2048", "objective": "time"}
    status, body = get(ui_url, "/api/train", params)
    assert status == 200
    cli = cli_json(
        capsys,
        [
            "train",
            "--model",
            "tiny-llama",
            "--system",
            "tpu-v5e:4x4",
            "--seq",
            "2048",
            "--objective",
            "time",
        ],
    )
    assert without_time(json.loads(body)) == without_time(cli)


@pytest.mark.parametrize(
    "path,params,argv",
    [
        (
            "/api/model",
            {"model": "llama-3-8b", "chip": "h100"},
            ["model", "llama-3-8b", "--chip", "h100"],
        ),
        ("/api/chip", {"name": "tpu-v5e"}, ["chip", "tpu-v5e"]),
        ("/api/system", {"name": "h100:64"}, ["system", "h100:64"]),
        ("/api/models", None, ["models"]),
    ],
)
def test_api_documents_are_the_cli_documents(ui_url, capsys, path, params, argv):
    status, body = get(ui_url, path, params)
    assert status == 200
    assert json.loads(body) == cli_json(capsys, argv)


def test_api_report_holds_every_document(ui_url):
    status, body = get(ui_url, "/api/report", SMALL)
    assert status == 200
    doc = json.loads(body)
    assert {"train", "model", "system", "chip", "commands", "roofline_version"} <= set(doc)
    assert doc["model"]["inputs"]["chip"] == doc["system"]["chip"] == "tpu-v5e"


def test_pasted_config_is_read_like_a_config_file(ui_url, capsys):
    status, body = get(ui_url, "/api/train", {"config": HF.read_text(), "system": "tpu-v5e:4x4"})
    assert status == 200, body
    doc = json.loads(body)
    cli = cli_json(capsys, ["train", "--model", str(HF), "--system", "tpu-v5e:4x4"])
    assert doc["step_time_s"] == cli["step_time_s"] and doc["plan"] == cli["plan"]


@pytest.mark.parametrize(
    "path,params,status,words",
    [
        (
            "/api/train",
            {**SMALL, "objective": "bogus"},
            400,
            ["invalid choice: 'bogus'", "Rule:", "Fix:"],
        ),
        ("/api/train", {**SMALL, "seq": "-5"}, 400, ["Rule:", "Fix:"]),
        (
            "/api/train",
            {**SMALL, "batch_tokens": "lots"},
            400,
            ["cannot read batch-tokens", "Fix:"],
        ),
        ("/api/train", {"model": "nope"}, 400, ["unknown model 'nope'", "Fix:"]),
        ("/api/train", {"bogus": "1"}, 400, ["has no input 'bogus'", "Fix:"]),
        ("/api/train", {"config": "{not json", "system": "tpu-v5e:4x4"}, 400, ["Fix:"]),
        ("/api/train", {"config": "x" * 70_000}, 400, ["at most 64,000 bytes", "Fix:"]),
        ("/api/ui", None, 404, ["no API for 'ui'", "Fix:"]),
    ],
)
def test_malformed_input_is_a_clear_4xx(ui_url, path, params, status, words):
    got, body = get(ui_url, path, params)
    assert got == status
    doc = json.loads(body)
    assert set(doc) == {"error", "what", "rule", "fix"} and doc["fix"]
    for w in words:
        assert w in doc["error"]


def test_requests_for_other_hosts_are_refused(ui_url):
    req = urllib.request.Request(ui_url + "/api/models", headers={"Host": "attacker.example"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    e.value.close()
    assert e.value.code == 400


def test_bad_input_on_the_page_is_a_400_page(ui_url):
    status, body = get(ui_url, "/", {**SMALL, "seq": "-5"})
    assert status == 400
    html = body.decode()
    assert 'id="error"' in html and "Rule:" in html and 'form id="inputs"' in html


def test_page_holds_form_and_report(ui_url):
    status, body = get(ui_url, "/", SMALL)
    assert status == 200
    html = body.decode()
    assert 'form id="inputs"' in html and 'id="chart-roofline"' in html
    assert '<option value="tiny-llama" selected>' in html


LOAD_REQUESTS, LOAD_CONCURRENCY = 320, 16


def test_load_on_loopback(ui_url):
    """320 requests, 16 at a time, over four kinds: no error, bounded latency."""
    mix = [
        ("/api/train", SMALL, 200),
        ("/api/train", {**SMALL, "seq": "1024"}, 200),
        ("/api/model", {"model": "llama-3-8b"}, 200),
        ("/api/train", {**SMALL, "seq": "zero"}, 400),
    ]
    for path, params, status in mix:  # warm: each input computed once
        assert get(ui_url, path, params)[0] == status

    def one(i: int) -> tuple[bool, float]:
        path, params, status = mix[i % len(mix)]
        t = time.perf_counter()
        got, _ = get(ui_url, path, params, timeout=30)
        return got == status, time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
        results = list(pool.map(one, range(LOAD_REQUESTS)))
    wall = time.perf_counter() - t0
    latencies = sorted(t for _, t in results)
    assert all(ok for ok, _ in results)
    p95 = latencies[int(0.95 * len(latencies))]
    print(
        f"load: {LOAD_REQUESTS} requests in {wall:.2f} s, median {statistics.median(latencies) * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms"
    )
    assert p95 < 2.0 and latencies[-1] < 10.0


def test_ui_command_refuses_a_busy_or_bad_port(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert main(["ui", "--port", str(busy)]) == 2
    assert f"cannot listen on 127.0.0.1:{busy}" in capsys.readouterr().err
    assert main(["ui", "--port", "70000"]) == 2
    assert "Rule: a TCP port is 1..65535" in capsys.readouterr().err


@pytest.mark.skipif(not has_command("serve"), reason="this tree has no `roofline serve` (issue 11)")
def test_api_report_with_serving(ui_url):
    serve = {"serve.system": "h100:8", "serve.prompt": "512", "serve.gen": "128"}
    status, body = get(
        ui_url, "/api/report", {**SMALL, "model": "llama-3-8b", "serve": "on", **serve}
    )
    assert status == 200, body
    doc = json.loads(body)["serve"]
    direct = {"model": "llama-3-8b", "system": "h100:8", "prompt": "512", "gen": "128"}
    status, body = get(ui_url, "/api/serve", direct)
    assert status == 200 and json.loads(body) == doc


def test_serving_inputs_are_checked(ui_url):
    params = {**SMALL, "serve": "on", "serve.bogus": "1"}
    status, body = get(ui_url, "/api/report", params)
    assert status == 400
    expected = "has no input 'bogus'" if has_command("serve") else "no `serve` command"
    assert expected in json.loads(body)["error"]


def test_the_form_offers_the_stacks_and_profiles_and_the_api_uses_them(ui_url, capsys):
    """The form's framework and profile boxes list the catalogs (auto first); a chosen stack
    and profile reach the document exactly as `roofline train --framework --profile` would."""
    status, page = get(ui_url, "/", {**SMALL, "framework": "megatron"})
    html = page.decode()
    assert status == 200
    assert '<option value="megatron" selected>' in html and '<option value="auto">' in html
    assert '<option value="datasheet">' in html and '<option value="fitted">' in html
    params = {
        "model": "tiny-llama",
        "system": "h100:8",
        "framework": "megatron",
        "profile": "datasheet",
    }
    status, body = get(ui_url, "/api/train", params)
    assert status == 200
    doc = json.loads(body)
    argv = ["train", "--model", "tiny-llama", "--system", "h100:8"]
    cli = cli_json(capsys, [*argv, "--framework", "megatron", "--profile", "datasheet"])
    assert without_time(doc) == without_time(cli)
    assert doc["inputs"]["framework_resolved"] == "megatron"
