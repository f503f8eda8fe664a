"""A loopback stand-in of the Hugging Face Hub's file API, for tests without the internet.

It serves what `huggingface_hub`'s `model_info`, `list_repo_tree` and `hf_hub_download` ask
for, with the headers the real Hub sends:

- `GET /api/models/<repo>/revision/<rev>`: the model info (`sha`, `siblings`, `gated`);
- `GET /api/models/<repo>/tree/<rev>`: the recursive file listing (`type`, `path`, `size`, `oid`);
- `HEAD` / `GET /<repo>/resolve/<rev>/<path>`: `ETag`, `X-Repo-Commit`, `Content-Length`,
  `Accept-Ranges`; a `Range: bytes=N-` request gets `206` and `Content-Range`;
- errors: `404` with `X-Error-Code: RepoNotFound` / `RevisionNotFound` / `EntryNotFound`, and
  `401` (no token) / `403` (a token) with `X-Error-Code: GatedRepo` for a gated repository's
  files.

Only 127.0.0.1, an ephemeral port, one daemon thread per connection and socket timeouts.
`requests` records `(method, path)` of every request; `drop` makes the next GETs of a file
send half of it and close the connection, and `fail_after_drop` answers the later GETs (the
client's resumption or restart) with 500;
`stall` makes GETs of a file send half of it and wait (the test kills the client meanwhile);
`metadata_status` (e.g. 503) answers every `/api/` request with that server error; a file
whose bytes are None is listed but answered with `EntryNotFound`.

`SilentServer` accepts connections on 127.0.0.1 and never answers (a Hub that hangs).
"""

import hashlib
import http.server
import json
import re
import socket
import threading
from urllib.parse import unquote, urlsplit


class Repository:
    """A model repository: `revisions` maps branch/tag names to commits, `commits` maps
    commit hashes to `{path: bytes}`."""

    def __init__(self, files, gated=False):
        self.commits = {}
        self.revisions = {}
        self.gated = gated
        self.add_commit("main", files)

    def add_commit(self, revision, files):
        digest = hashlib.sha1(json.dumps(sorted(files)).encode())
        for path in sorted(files):
            digest.update(files[path])
        commit = digest.hexdigest()
        self.commits[commit] = dict(files)
        self.revisions[revision] = commit
        return commit

    def resolve(self, revision):
        """The commit of a branch, tag or commit hash, or None."""
        if revision in self.commits:
            return revision
        return self.revisions.get(revision)


class HubServer:
    """`with HubServer({"owner/name": Repository(...)}) as hub:` serves at `hub.endpoint`."""

    def __init__(self, repositories):
        self.repositories = dict(repositories)
        self.requests = []
        self.drop = {}  # path in repo -> how many more GETs to cut in half
        self.fail_after_drop = False
        self.stall = set()  # paths in repo whose GET sends half, then waits for `release`
        self.stalled = threading.Event()  # set once a stalled transfer has sent its half
        self.release = threading.Event()
        self.metadata_status = None  # e.g. 503: every /api/ request fails with it
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self):
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def file_requests(self, method="GET"):
        """The resolve requests of `method` seen so far, as paths."""
        with self._lock:
            return [p for m, p in self.requests if m == method and "/resolve/" in p]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class SilentServer:
    """`with SilentServer() as silent:` listens at `silent.endpoint`: the kernel completes
    every connection (a backlog of 16) but nothing reads or answers a request."""

    def __init__(self):
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)

    @property
    def endpoint(self):
        host, port = self._socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._socket.close()


_INFO = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(/revision/(?P<rev>[^/]+))?")
_TREE = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<path>/.*)?")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)")


def _etag(data):
    return '"' + hashlib.sha256(data).hexdigest() + '"'


def _handler(hub):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10  # seconds a connection may stay silent

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._serve(head=True)

        def do_GET(self):
            self._serve(head=False)

        def _serve(self, head):
            path = unquote(urlsplit(self.path).path)
            with hub._lock:
                hub.requests.append((self.command, path))
            if hub.metadata_status and path.startswith("/api/"):
                return self._error(hub.metadata_status, None, "Service Unavailable")
            for pattern, serve in ((_INFO, self._info), (_TREE, self._tree)):
                match = pattern.fullmatch(path)
                if match:
                    return serve(match)
            match = _RESOLVE.fullmatch(path)
            if match:
                return self._resolve(match, head)
            self._error(404, None, "Not found")

        def _repository(self, match):
            """`(repository, commit)`, or None after answering with the Hub's error."""
            repository = hub.repositories.get(match["repo"])
            if repository is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            revision = match["rev"] or "main"
            commit = repository.resolve(revision)
            if commit is None:
                self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
                return None
            return repository, commit

        def _info(self, match):
            found = self._repository(match)
            if found:
                repository, commit = found
                files = repository.commits[commit]
                self._json(
                    {
                        "id": match["repo"],
                        "modelId": match["repo"],
                        "sha": commit,
                        "private": False,
                        "gated": "manual" if repository.gated else False,
                        "siblings": [{"rfilename": p} for p in sorted(files)],
                    },
                    commit,
                )

        def _tree(self, match):
            found = self._repository(match)
            if found:
                repository, commit = found
                files = repository.commits[commit]
                entries = [
                    {
                        "type": "file",
                        "path": p,
                        "size": len(files[p] or b""),
                        "oid": hashlib.sha1(files[p] or b"").hexdigest(),
                    }
                    for p in sorted(files)
                ]
                self._json(entries, commit)

        def _resolve(self, match, head):
            found = self._repository(match)
            if not found:
                return
            repository, commit = found
            if repository.gated:
                if self.headers.get("Authorization"):
                    return self._error(403, "GatedRepo", "Access to this model is restricted.")
                return self._error(401, "GatedRepo", "Access to this model is restricted.")
            data = repository.commits[commit].get(match["path"])
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found", commit)
            start = 0
            ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if ranged and not head:
                start = int(ranged[1])
            with hub._lock:
                cut = not head and hub.drop.get(match["path"], 0) > 0
                fail = not head and not cut and hub.fail_after_drop and match["path"] in hub.drop
                if cut:
                    hub.drop[match["path"]] -= 1
            if fail:
                return self._error(500, None, "Internal Error")
            self.send_response(206 if start else 200)
            self.send_header("ETag", _etag(data))
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            if not head and match["path"] in hub.stall:  # Half the bytes, then silence.
                self.wfile.write(data[start : start + (len(data) - start) // 2])
                self.wfile.flush()
                hub.stalled.set()
                hub.release.wait(timeout=30)
                self.close_connection = True
                return
            if cut:  # Half the bytes, then the connection drops.
                self.wfile.write(data[start : start + (len(data) - start) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(data[start:])

        def _json(self, value, commit):
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status, code, message, commit=None):
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler
