"""Browser safety and keys: --allowed-hosts, an empty --api-key refused, the key read
from DITMEM_API_KEY (and said so in --help), no response built from the Host header."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from harness import running_server, toy_engine

from ditmem.server.app import ServerConfig, create_app
from ditmem.server.security import check_api_key


def test_allowed_hosts():
    with running_server(toy_engine(), allowed_hosts=["localhost", "127.0.0.1"]) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        r = httpx.get(f"{url}/health", headers={"host": "rebound.example"})
        assert r.status_code == 400 and "location" not in r.headers
        r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"},
                       headers={"host": "rebound.example:8000"})
        assert r.status_code == 400


@pytest.mark.parametrize("key", ["", "   "])
def test_empty_api_key_is_refused(key):
    with pytest.raises(ValueError, match="empty"):
        check_api_key(key)
    with pytest.raises(ValueError, match="empty"):
        create_app(toy_engine(), ServerConfig(model_name="toy", api_key=key))


def test_serve_help_names_the_key_variable_and_refuses_an_empty_key():
    out = subprocess.run([sys.executable, "-m", "ditmem.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for flag in ("DITMEM_API_KEY", "--drain-timeout", "--allowed-hosts", "--max-body-mb",
                 "--max-request-s", "--max-pixels", "--video-store-mb", "--video-ttl-s"):
        assert flag in text, flag
    env = {"DITMEM_API_KEY": "", "PATH": "/usr/bin:/bin"}
    bad = subprocess.run([sys.executable, "-m", "ditmem.cli", "serve"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert bad.returncode != 0 and "empty" in bad.stderr
