"""`-m hf:ORG/REPO[:QUANT]` and `pull hf:...` through huggingface_hub, against a local server
that stands in for the hub (HF_ENDPOINT): the hub itself cannot be reached from these
machines. The server answers the few requests huggingface_hub makes (a repository's file
tree and info, each file's HEAD and GET), as the hub's API does."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlparse

import pytest

from llama_np.errors import LlamaNpError, UsageError
from llama_np.io import hf_hub
from llama_np.io.hub import pull, resolve_model

SHA = "0123456789abcdef0123456789abcdef01234567"  # the repositories' commit
REPOS = {
    "org/tiny-GGUF": {"tiny-Q4_K_M.gguf": b"GGUF q4_k_m", "tiny-Q8_0.gguf": b"GGUF q8_0",
                      "README.md": b"# tiny"},
    "org/one-GGUF": {"only-f16.gguf": b"GGUF f16"},
    "org/tiny": {"config.json": b"{}", "model.safetensors": b"weights",
                 "tokenizer.json": b"{}", "pytorch_model.bin": b"a pickle", "README.md": b"x"},
    "org/split-GGUF": {"big-Q4_K_M-00001-of-00002.gguf": b"a",
                       "big-Q4_K_M-00002-of-00002.gguf": b"b"},
}  # fmt: skip


class Hub(BaseHTTPRequestHandler):
    """GET /api/models/ORG/REPO[/revision/REV], /api/models/ORG/REPO/tree/REV; HEAD and GET
    /ORG/REPO/resolve/REV/FILE."""

    requests: ClassVar[list[str]] = []

    def log_message(self, *args) -> None:
        pass

    def _file(self) -> tuple[str, bytes] | None:
        parts = unquote(urlparse(self.path).path).strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if name in REPOS.get(repo, {}):
                return name, REPOS[repo][name]
        return None

    def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        Hub.requests.append(f"{'HEAD' if head else 'GET'} {self.path}")
        found = self._file()
        if found is not None:
            _, body = found
            etag = hashlib.sha256(body).hexdigest()
            self._send(200, body, {"X-Repo-Commit": SHA, "ETag": f'"{etag}"'}, head)
            return
        parts = urlparse(self.path).path.strip("/").split("/")
        repo = "/".join(parts[2:4])
        if parts[:2] == ["api", "models"] and repo in REPOS:
            files = REPOS[repo]
            if len(parts) > 4 and parts[4] == "tree":
                body = [
                    {"type": "file", "path": n, "size": len(b), "oid": SHA}
                    for n, b in files.items()
                ]
            else:
                body = {"id": repo, "sha": SHA, "siblings": [{"rfilename": n} for n in files]}
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
            return
        self._send(
            404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head
        )


@pytest.fixture
def hub(tmp_path, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    import huggingface_hub.constants as constants

    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    Hub.requests = []
    yield tmp_path / "hub"
    server.shutdown()
    server.server_close()


def test_a_gguf_repository_gives_the_quantization_asked_for(hub):
    default = resolve_model("hf:org/tiny-GGUF")
    assert default.name == "tiny-Q4_K_M.gguf" and default.read_bytes() == b"GGUF q4_k_m"
    q8 = pull("hf:org/tiny-GGUF:q8_0")  # any case, as llama.cpp's -hf
    assert q8.name == "tiny-Q8_0.gguf" and q8.read_bytes() == b"GGUF q8_0"
    assert str(q8).startswith(str(hub))  # huggingface_hub's cache
    assert resolve_model("hf:org/one-GGUF").name == "only-f16.gguf"  # the only one


def test_a_checkpoint_repository_gives_its_directory_without_pickles(hub):
    path = resolve_model("hf:org/tiny")
    assert path.is_dir() and (path / "config.json").read_bytes() == b"{}"
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors",
                                                       "tokenizer.json"]  # fmt: skip


def test_offline_the_cache_answers_and_nothing_is_asked(hub, monkeypatch):
    first = resolve_model("hf:org/tiny-GGUF:Q8_0")
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    Hub.requests = []
    assert resolve_model("hf:org/tiny-GGUF:Q8_0") == first
    assert Hub.requests == []
    with pytest.raises(LlamaNpError, match="Q4_K_M"):
        resolve_model("hf:org/tiny-GGUF")  # never fetched


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("hf:org/tiny-GGUF:Q2_K", "no Q2_K GGUF in org/tiny-GGUF"),
        ("hf:org/split-GGUF", "split over several files"),
        ("hf:org/tiny:Q4_K_M", "holds no GGUF"),
        ("hf:no-slash", "hf:ORG/REPO"),
        ("hf:org/missing", "org/missing"),
    ],
)
def test_mistakes_are_one_line(hub, spec, says):
    with pytest.raises((UsageError, LlamaNpError)) as e:
        resolve_model(spec)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_spec_is_parsed_as_llama_cpp_writes_it():
    assert hf_hub.parse("hf:bartowski/Qwen3-0.6B-GGUF:Q8_0") == (
        "bartowski/Qwen3-0.6B-GGUF",
        "Q8_0",
    )
    assert hf_hub.parse("hf:google/gemma-3-1b-it") == ("google/gemma-3-1b-it", None)
    for bad in ("hf:", "hf:a/b/c", "hf:../x"):
        with pytest.raises(UsageError):
            hf_hub.parse(bad)


def test_a_path_is_not_a_repository(tmp_path):
    assert not hf_hub.is_hf(str(tmp_path)) and hf_hub.is_hf("hf:a/b")
    assert isinstance(resolve_model(str(tmp_path)), Path)
