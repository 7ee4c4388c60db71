"""The loopback Gemini stub itself: Google's error format, its CLI, its faults."""

from __future__ import annotations

import subprocess
import sys

import httpx2
import pytest

from sim.testing.gemini_stub import GeminiStubServer

ROUTE = "/v1beta/models/gemini-2.5-flash:generateContent"
BODY = {
    "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
    "generationConfig": {
        "responseMimeType": "application/json",
        "responseJsonSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


def test_answer_and_google_error_format(gemini_stub: GeminiStubServer) -> None:
    with httpx2.Client(base_url=gemini_stub.base_url) as http:
        ok = http.post(ROUTE, json=BODY).json()
        assert ok["candidates"][0]["finishReason"] == "STOP"
        assert ok["usageMetadata"]["promptTokenCount"] > 0
        assert ok["modelVersion"] == "gemini-2.5-flash"
        gemini_stub.enqueue("rate_limit")
        limited = http.post(ROUTE, json=BODY)
        assert limited.status_code == 429
        error = limited.json()["error"]
        assert error["status"] == "RESOURCE_EXHAUSTED" and error["code"] == 429
        retry = [d for d in error["details"] if d["@type"].endswith("google.rpc.RetryInfo")]
        assert retry == [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.01s"}
        ]
        missing = http.post("/v1beta/models/x:streamGenerateContent", json=BODY)
        assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
        assert http.get("/stub/stats").json()["generations"] == 1


def test_unknown_fault_is_refused(gemini_stub: GeminiStubServer) -> None:
    gemini_stub.enqueue("blocked")
    with pytest.raises(ValueError, match="unknown fault"):
        gemini_stub.enqueue("meteor")


def test_cli_stub_server_speaks_gemini() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "stub-server", "--api", "gemini", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "stub server on http://127.0.0.1:" in line and "gemini API" in line
        base = line.split(" on ", 1)[1].split()[0]
        answer = httpx2.post(base + ROUTE, json=BODY, timeout=10).json()
        assert answer["candidates"][0]["content"]["role"] == "model"
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_rejects_faults_of_the_other_api() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sim", "stub-server", "--faults", "blocked"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "blocked" in result.stderr
