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

Uploads, as `huggingface_hub`'s `create_repo`, `create_branch` and `create_commit` send them
(with `HF_HUB_DISABLE_XET`, the LFS protocol instead of Xet storage):

- `POST /api/repos/create` (`name`, `organization`, `visibility`): a new empty repository,
  `409` when it exists; `private` records the visibility;
- `POST /api/models/<repo>/branch/<branch>`: a branch at the current `main`, `409` if it exists;
- `POST /api/validate-yaml`: no errors, no warnings (the model card's header is checked by
  the tests themselves);
- `POST /api/models/<repo>/preupload/<rev>`: `lfs` for weights (`*.safetensors`, `*.h5`,
  `*.onnx`, `*.bin`, `*.npz`) and any file over 100 kB, `regular` otherwise;
- `POST /<repo>.git/info/lfs/objects/batch`: a basic-transfer `upload` action per object
  not stored yet, pointing at `PUT /lfs/<oid>`, which checks the bytes' sha256;
- `POST /api/models/<repo>/commit/<rev>` (NDJSON: header, `file` in base64, `lfsFile` by
  oid, `deletedFile`): the new commit, all files or nothing; an `lfsFile` whose object was
  never uploaded is a `400` and changes nothing.

`reject_lfs` answers every LFS upload with `403`, `reject_commit` every commit with `422`
(the failures after which the repository must be as it was); `authorizations` records the
`Authorization` header of every upload request.

`SilentServer` accepts connections on 127.0.0.1 and never answers (a Hub that hangs).
"""

import base64
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

    def __init__(self, files, gated=False, private=False):
        self.commits = {}
        self.revisions = {}
        self.gated = gated
        self.private = private
        self.messages = {}  # commit -> the commit message of an upload
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
        self.missing_status = 404  # the Hub answers 401 to a request without a token
        self.metadata_status = None  # e.g. 503: every /api/ request fails with it
        self.lfs_objects = {}  # sha256 hex -> bytes uploaded through the LFS protocol
        self.reject_lfs = False  # every LFS upload answered with 403
        self.reject_commit = False  # every commit answered with 422
        self.authorizations = []  # the Authorization header of every upload request
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
_BRANCH = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/branch/(?P<branch>[^/]+)")
_PREUPLOAD = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)")
_COMMIT = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)")
_LFS_BATCH = re.compile(r"/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch")
_LFS_PUT = re.compile(r"/lfs/(?P<oid>[0-9a-f]{64})")
_LFS_SUFFIXES = (".safetensors", ".h5", ".onnx", ".bin", ".npz")


def _is_lfs(entry):
    """The Hub's choice for a file: LFS for weights and anything over 100 kB."""
    return entry["path"].endswith(_LFS_SUFFIXES) or entry["size"] > 100_000


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

        def do_POST(self):
            path = unquote(urlsplit(self.path).path)
            body = self._body()
            with hub._lock:
                hub.requests.append((self.command, path))
                hub.authorizations.append(self.headers.get("Authorization"))
            if path == "/api/repos/create":
                return self._create_repo(json.loads(body))
            if path == "/api/validate-yaml":
                return self._json({"errors": [], "warnings": []})
            for pattern, serve in (
                (_BRANCH, self._create_branch),
                (_PREUPLOAD, self._preupload),
                (_COMMIT, self._commit),
                (_LFS_BATCH, self._lfs_batch),
            ):
                match = pattern.fullmatch(path)
                if match:
                    return serve(match, body)
            self._error(404, None, "Not found")

        def do_PUT(self):
            path = unquote(urlsplit(self.path).path)
            body = self._body()
            with hub._lock:
                hub.requests.append((self.command, path))
            match = _LFS_PUT.fullmatch(path)
            if not match:
                return self._error(404, None, "Not found")
            if hub.reject_lfs:
                return self._error(403, None, "LFS upload refused")
            if hashlib.sha256(body).hexdigest() != match["oid"]:
                return self._error(400, None, "sha256 mismatch")
            with hub._lock:
                hub.lfs_objects[match["oid"]] = body
            self._json({})

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _create_repo(self, payload):
            repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
            with hub._lock:
                exists = repo_id in hub.repositories
                if not exists:
                    hub.repositories[repo_id] = Repository(
                        {}, private=payload.get("visibility") == "private"
                    )
            url = f"{hub.endpoint}/{repo_id}"
            if exists:  # The Hub's 409 names the repository too.
                return self._error(409, None, "You already created this model repo", url=url)
            self._json({"url": url, "name": repo_id})

        def _create_branch(self, match, body):
            repository = hub.repositories.get(match["repo"])
            if repository is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            with hub._lock:
                if match["branch"] in repository.revisions:
                    return self._error(409, None, "Reference already exists")
                repository.revisions[match["branch"]] = repository.revisions["main"]
            self._json({})

        def _preupload(self, match, body):
            found = self._repository(match)
            if found:
                files = json.loads(body)["files"]
                self._json(
                    {
                        "files": [
                            {
                                "path": entry["path"],
                                "uploadMode": "lfs" if _is_lfs(entry) else "regular",
                                "shouldIgnore": False,
                            }
                            for entry in files
                        ]
                    },
                    found[1],
                )

        def _lfs_batch(self, match, body):
            if match["repo"] not in hub.repositories:
                return self._error(404, "RepoNotFound", "Repository not found")
            objects = []
            for item in json.loads(body)["objects"]:
                entry = {"oid": item["oid"], "size": item["size"]}
                if item["oid"] not in hub.lfs_objects:
                    href = f"{hub.endpoint}/lfs/{item['oid']}"
                    entry["actions"] = {"upload": {"href": href}}
                objects.append(entry)
            self._json({"transfer": "basic", "objects": objects})

        def _commit(self, match, body):
            found = self._repository(match)
            if not found:
                return
            repository, commit = found
            if hub.reject_commit:
                return self._error(422, None, "Commit refused")
            files = dict(repository.commits[commit])
            message = None
            for line in body.splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "header":
                    message = value.get("summary")
                elif item["key"] == "file":
                    files[value["path"]] = base64.b64decode(value["content"])
                elif item["key"] == "lfsFile":
                    data = hub.lfs_objects.get(value["oid"])
                    if data is None:
                        return self._error(400, None, f"LFS object of {value['path']} missing")
                    files[value["path"]] = data
                elif item["key"] == "deletedFile":
                    files.pop(value["path"], None)
            with hub._lock:
                new = repository.add_commit(match["rev"] or "main", files)
                repository.messages[new] = message
            self._json(
                {"commitUrl": f"{hub.endpoint}/{match['repo']}/commit/{new}", "commitOid": new}
            )

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
                self._error(hub.missing_status, "RepoNotFound", "Repository not found")
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

        def _json(self, value, commit=None):
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status, code, message, commit=None, url=None):
            body = json.dumps({"error": message, **({"url": url} if url else {})}).encode()
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
