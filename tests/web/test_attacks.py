"""`roofline ui` under attack, over real HTTP on loopback (issue 22 items 1-2).

Any page in the user's browser can make it send requests to 127.0.0.1, so the server must not
open a path a request names (/etc/passwd, ../ traversal, a symlink out, a FIFO), must refuse
requests of other sites and requests without the session token, must bound each request's
work in time and memory, and must keep answering while one request is slow.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from roofline.cli import main
from roofline.web.app import create_app
from roofline.web.worker import Limits

TOKEN = "attack-test-token"
HF = Path(__file__).parents[1] / "data" / "hf" / "qwen3-0.6b.json"
SERVE = {"model": "tiny-llama", "system": "h100:8"}
SECRET = "daemon:x:1:1"  # a line of /etc/passwd: must never come back
SLOW_LINES = 3_000_000  # a 27 MB lengths file: ~10 s of work, past the 6 s limit
TIMEOUT_S = 6.0  # a small serve takes ~1 s of CPU (more on a busy machine)


def request(
    base: str,
    path: str,
    params: dict | None = None,
    *,
    headers: dict | None = None,
    token: str | None = TOKEN,
    body: bytes | None = None,
    timeout: float = 60,
) -> tuple[int, bytes, dict]:
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    h = dict(headers or {})
    if token is not None:
        h.setdefault("Authorization", f"token {token}")
    req = urllib.request.Request(url, data=body, headers=h, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read(), dict(e.headers)


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n')
    out = "".join(parts).encode()
    for k, (name, data) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        )
        out += head.encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def cli_json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def outputs(doc: dict) -> dict:
    """A document less its inputs (which name the file by its path) and its search time."""
    return {k: v for k, v in doc.items() if k not in ("inputs", "search_time_s")}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ui-data")
    (d / "lengths.csv").write_text("prompt,output\n1024,256\n2048,128\n")
    (d / "config.json").write_text(HF.read_text())
    (d / "escape.csv").symlink_to("/etc/passwd")
    os.mkfifo(d / "fifo.csv")
    with open(d / "huge.csv", "wb") as f:  # 2 GB, sparse
        f.truncate(2 * 2**30)
    (d / "slow.csv").write_text("1024,256\n" * SLOW_LINES)
    return d


@pytest.fixture(scope="module")
def ui(data_dir, serve_app):
    app = create_app(token=TOKEN, data_dir=data_dir, limits=Limits(timeout_s=TIMEOUT_S, workers=2))
    with serve_app(app) as url:
        yield url


def refused_read(status: int, body: bytes) -> str:
    assert status == 400, body
    doc = json.loads(body)
    assert SECRET not in body.decode() and "root:" not in body.decode()
    return doc["error"]


# -- no file a request names outside the data dir is ever opened --------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {**SERVE, "lengths": "/etc/passwd"},
        {**SERVE, "lengths": "../../../../../../etc/passwd"},
        {**SERVE, "lengths": "escape.csv"},  # a symlink in the data dir pointing out
        {**SERVE, "lengths": "/proc/self/environ"},
        {"model": "/etc/passwd", "system": "h100:8"},
        {"model": "../../../../../../etc/passwd", "system": "h100:8"},
    ],
)
def test_paths_outside_the_data_dir_are_never_read(ui, params):
    command = "serve" if "lengths" in params else "train"
    error = refused_read(*request(ui, f"/api/{command}", params)[:2])
    assert "not among the files this server may read" in error or "unknown model" in error


@pytest.mark.parametrize("name", ["framework", "profile"])
def test_spec_files_outside_are_refused(ui, name):
    status, body, _ = request(ui, "/api/train", {**SERVE, name: "/etc/passwd"})
    refused_read(status, body)


def test_a_fifo_device_or_huge_file_is_refused_at_once(ui):
    for lengths, words in [
        ("fifo.csv", "not a regular file"),
        ("/dev/zero", "not among the files"),
        ("huge.csv", "2,147,483,648 bytes"),
    ]:
        t = time.perf_counter()
        error = refused_read(*request(ui, "/api/serve", {**SERVE, "lengths": lengths})[:2])
        assert words in error and time.perf_counter() - t < 10


def test_the_data_dir_and_uploads_are_read_like_the_cli(ui, data_dir, capsys):
    argv = ["serve", "--model", "tiny-llama", "--system", "h100:8"]
    cli = cli_json(capsys, [*argv, "--lengths", str(data_dir / "lengths.csv")])
    status, body, _ = request(ui, "/api/serve", {**SERVE, "lengths": "lengths.csv"})
    assert status == 200, body
    assert outputs(json.loads(body)) == outputs(cli)
    upload, ctype = multipart(SERVE, {"lengths": ("my lengths.csv", b"1024,256\n2048,128\n")})
    status, body, _ = request(ui, "/api/serve", body=upload, headers={"Content-Type": ctype})
    assert status == 200, body
    assert outputs(json.loads(body)) == outputs(cli)
    # sent under the CLI file's own name: the model is named by its file (the launch line says it)
    config, ctype = multipart({"system": "tpu-v5e:4x4"}, {"model": (HF.name, HF.read_bytes())})
    status, body, _ = request(ui, "/api/train", body=config, headers={"Content-Type": ctype})
    assert status == 200, body
    train = cli_json(capsys, ["train", "--model", str(HF), "--system", "tpu-v5e:4x4"])
    assert outputs(json.loads(body)) == outputs(train)


def test_errors_about_a_file_do_not_quote_it(ui, data_dir):
    (data_dir / "bad.csv").write_text("1024,256\nhunter2 is the password\n")
    error = refused_read(*request(ui, "/api/serve", {**SERVE, "lengths": "bad.csv"})[:2])
    assert "line 2" in error and "hunter2" not in error


# -- only this session's own pages may ask ------------------------------------------------------


def test_no_token_or_a_wrong_token_is_refused(ui):
    for token in (None, "guess"):
        status, body, _ = request(ui, "/api/models", token=token)
        assert status == 403 and "token" in json.loads(body)["error"]
    status, body, _ = request(ui, "/", token=None)
    assert status == 403 and b"token" in body


def test_the_token_in_the_url_sets_a_strict_cookie_that_then_suffices(ui):
    status, _, headers = request(ui, "/api/models", {"token": TOKEN}, token=None)
    cookie = headers.get("set-cookie", "")
    assert status == 200 and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, _ = request(ui, "/api/models", token=None, headers={"Cookie": cookie.split(";")[0]})
    assert status == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
def test_cross_site_requests_are_refused_even_with_the_token(ui, headers):
    status, body, _ = request(ui, "/api/models", headers=headers)
    assert status == 403 and "Rule:" in json.loads(body)["error"]


def test_same_origin_requests_pass(ui):
    host = urllib.parse.urlparse(ui).netloc
    headers = {"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
    assert request(ui, "/api/models", headers=headers)[0] == 200


def test_a_foreign_host_is_still_refused(ui):
    assert request(ui, "/api/models", headers={"Host": "attacker.example"})[0] == 400


# -- huge inputs ---------------------------------------------------------------------------------


def test_huge_numbers_are_one_paragraph(ui, data_dir):
    digits = "7" * 5000
    for path, params in [
        ("/api/train", {**SERVE, "seq": digits}),
        ("/api/train", {**SERVE, "plan": f"fsdp={digits}"}),
        ("/api/train", {"system": "h100:8", "config": HF.read_text().replace("1024", digits, 1)}),
    ]:
        status, body, _ = request(ui, path, params)
        assert status == 400, body
        assert "Fix:" in json.loads(body)["error"]


def raw_post(base: str, headers: str, body: bytes = b"") -> tuple[int, bytes]:
    """A POST written by hand on a socket (a declared length the body need not match)."""
    import socket

    u = urllib.parse.urlparse(base)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(
            f"POST /api/serve HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: token {TOKEN}\r\n"
            f"Content-Type: multipart/form-data; boundary=x\r\n{headers}\r\n".encode()
            + body
        )
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < 40:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, rest = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


@pytest.mark.parametrize(
    "declared,words",
    [
        ("Content-Length: 70000000\r\n", "70,000,000 bytes"),  # over 64 MiB: refused unread
        ("Transfer-Encoding: chunked\r\n", "more than 67,108,864 bytes"),
    ],
)
def test_an_upload_over_the_limit_is_refused(ui, declared, words):
    body = b""
    if "chunked" in declared:  # no length declared: counted while read
        chunk = b"1,1\n" * (1 << 18)  # 1 MiB
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(65)) + b"0\r\n\r\n"
    status, rest = raw_post(ui, declared, body)
    assert status == 413 and words.encode() in rest and b"at most 64 MiB" in rest


def test_a_5000_digit_length_is_a_400_of_the_http_server(ui):
    status, rest = raw_post(ui, f"Content-Length: {'9' * 5000}\r\n")
    assert status == 400 and b"Traceback" not in rest


# -- bounded work; slow work blocks nobody ---------------------------------------------------------


def test_a_slow_request_is_stopped_and_blocks_no_other(data_dir, serve_app):
    """A 27 MB lengths file takes the serving model seconds; the app's own short timeout (not
    the code's speed, which this round made several times faster) decides that it is slow."""
    timeout_s = 1.5
    app = create_app(token=TOKEN, data_dir=data_dir, limits=Limits(timeout_s=timeout_s, workers=2))
    slow: dict = {}
    with serve_app(app) as url:

        def run_slow():
            t = time.perf_counter()
            slow["reply"] = request(url, "/api/serve", {**SERVE, "lengths": "slow.csv"})
            slow["s"] = time.perf_counter() - t

        thread = threading.Thread(target=run_slow)
        thread.start()
        time.sleep(0.3)  # the slow one is computing
        t = time.perf_counter()
        status, _, _ = request(url, "/api/chip", {"name": "h100"})
        quick = time.perf_counter() - t
        thread.join(timeout=60)
    status_slow, body, _ = slow["reply"]
    assert status == 200 and quick < 5.0  # answered while the slow one still ran
    assert status_slow == 503 and f"longer than {timeout_s:g} s" in json.loads(body)["error"]
    assert slow["s"] < timeout_s + 10


def test_requests_beyond_the_workers_are_refused_not_queued(data_dir, serve_app):
    app = create_app(token=TOKEN, data_dir=data_dir, limits=Limits(timeout_s=TIMEOUT_S, workers=1))
    with serve_app(app) as url:
        thread = threading.Thread(
            target=request, args=(url, "/api/serve", {**SERVE, "lengths": "slow.csv"})
        )
        thread.start()
        time.sleep(0.5)
        status, body, headers = request(url, "/api/chip", {"name": "tpu-v5e"})
        thread.join(timeout=60)
    assert status == 503 and "already computing 1 requests" in json.loads(body)["error"]


def test_memory_is_bounded(data_dir, serve_app):
    """Reading a 27 MB lengths file into Python lists takes hundreds of MB: stopped at 64 MiB."""
    app = create_app(token=TOKEN, data_dir=data_dir, limits=Limits(memory_bytes=64 << 20))
    with serve_app(app) as url:
        status, body, _ = request(url, "/api/serve", {**SERVE, "lengths": "slow.csv"})
        small = request(url, "/api/chip", {"name": "h100"})[0]
    assert status == 503 and "more than 64 MiB of memory" in json.loads(body)["error"]
    assert small == 200  # a small request fits


def test_ui_command_checks_its_bounds_and_data_dir(capsys, tmp_path):
    for argv, words in [
        (["--data-dir", str(tmp_path / "missing")], "is not a folder"),
        (["--timeout", "0"], "--timeout 0"),
        (["--memory-mib", "1"], "--memory-mib 1"),
        (["--workers", "0"], "--workers 0"),
    ]:
        capsys.readouterr()
        assert main(["ui", *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err


def test_an_empty_file_input_leaves_the_chosen_model(ui, capsys):
    """A form's file input left empty sends a part with no file name: not an upload."""
    body, ctype = multipart({"model": "tiny-llama", "system": "h100:8"}, {"model": ("", b"")})
    status, got, _ = request(ui, "/api/train", body=body, headers={"Content-Type": ctype})
    assert status == 200, got
    cli = cli_json(capsys, ["train", "--model", "tiny-llama", "--system", "h100:8"])
    assert outputs(json.loads(got)) == outputs(cli)
