"""loom.Client: one method per use, each one or a few calls of Loom's gRPC API (proto/loom/v1)."""
import json
import os
import time
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Union

import grpc

from loom.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc, plan_pb2

Spec = Union[dict, str, "os.PathLike[str]"]

FINAL_STATES = frozenset({job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED})


class LoomError(Exception):
    """A call the planner refused or could not answer: `code` is the gRPC status code's name
    (NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE, ...), `message` the planner's words."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class LogLine(NamedTuple):
    """One line of a rank's log (without its newline)."""
    rank: int
    attempt: int
    line: str


def state_name(job: job_pb2.Job) -> str:
    """The job's state as its name: "RUNNING", "SUCCEEDED", ..."""
    return job_pb2.JobState.Name(job.state)


def _error(e: grpc.RpcError) -> LoomError:
    return LoomError(e.code().name, e.details() or "")


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise LoomError("INVALID_ARGUMENT", f"{what} {path}: {e.strerror}") from None


class Client:
    """A connection to a Loom planner (loom-planner, or `loomd --standalone`).

    `address` is host:port, as `loomctl --server`. Credentials are loomctl's, with the same
    environment defaults:

    - `token` (LOOM_TOKEN), or `token_file` (LOOM_TOKEN_FILE): a bearer token sent with every
      call (`authorization: Bearer TOKEN`). A planner without --tokens writes an admin's into
      its state directory as admin.token.
    - `ca` (LOOM_CA): the CA certificate that signed the planner's; given, the channel is TLS.
      `cert` and `key` (LOOM_CERT, LOOM_KEY): a client certificate for mutual TLS.
      `server_name` (LOOM_SERVER_NAME): the name the planner's certificate carries, when the
      address is not it.

    `timeout` bounds each unary call in seconds; streams (watch, follow_logs) run until they
    end. Use it as a context manager, or call close()."""

    def __init__(self, address: str = "127.0.0.1:7450", token: Optional[str] = None, *,
                 token_file: Optional[str] = None, ca: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, server_name: Optional[str] = None, timeout: float = 30.0):
        env = os.environ.get
        if token is None:
            token_file = token_file or env("LOOM_TOKEN_FILE")
            token = _read(token_file, "token file").decode().strip() if token_file else env("LOOM_TOKEN")
        ca, cert, key = ca or env("LOOM_CA"), cert or env("LOOM_CERT"), key or env("LOOM_KEY")
        server_name = server_name or env("LOOM_SERVER_NAME")
        if bool(cert) != bool(key):
            raise LoomError("INVALID_ARGUMENT", "a client certificate needs both cert and key")
        if cert and not ca:
            raise LoomError("INVALID_ARGUMENT", "a client certificate needs TLS: give ca, the CA that signed the "
                                                "planner's certificate")
        # A Plan has an entry per tensor: larger than gRPC's default 4 MiB for large models.
        options = [("grpc.max_receive_message_length", -1)]
        if ca:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(ca, "ca"),
                private_key=_read(key, "key") if key else None,
                certificate_chain=_read(cert, "cert") if cert else None)
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._jobs = job_pb2_grpc.JobServiceStub(self._channel)
        self._nodes = node_pb2_grpc.NodeServiceStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return method(request, timeout=timeout or self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None

    def _stream(self, method, request) -> Iterator:
        try:
            yield from method(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(e) from None

    @staticmethod
    def _spec_request(spec: Spec):
        """(spec_json, base_dir): a path's file is read, and the planner resolves its relative paths
        (and a "deepspeed": "ds_config.json") against its directory, as loomctl does."""
        if isinstance(spec, dict):
            return json.dumps(spec), ""
        text = os.fspath(spec)
        if isinstance(spec, str) and text.lstrip().startswith("{"):
            return text, ""
        path = os.path.abspath(text)
        try:
            with open(path) as f:
                return f.read(), os.path.dirname(path)
        except OSError as e:
            raise LoomError("INVALID_ARGUMENT", f"{path}: {e.strerror}") from None

    # ---- jobs -------------------------------------------------------------------------------------

    def submit(self, spec: Spec, request_id: str = "") -> job_pb2.Job:
        """Submits a job: `spec` is a dict, a JSON text, or the path of a spec file. A retry with
        the same request_id returns the job the first call created."""
        text, base_dir = self._spec_request(spec)
        request = job_pb2.CreateJobRequest(spec_json=text, request_id=request_id, base_dir=base_dir)
        return self._call(self._jobs.CreateJob, request).job

    def validate(self, spec: Spec) -> dict:
        """The spec with every default filled in (as `loomctl validate -o json`), or LoomError
        INVALID_ARGUMENT naming what is wrong. Stores nothing."""
        text, base_dir = self._spec_request(spec)
        response = self._call(self._jobs.ValidateJob, job_pb2.ValidateJobRequest(spec_json=text, base_dir=base_dir))
        return json.loads(response.normalized_spec_json)

    def get(self, job_id: str) -> job_pb2.Job:
        return self._call(self._jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id))

    def list(self, states: Iterable[str] = (), limit: int = 1000, full: bool = False) -> List[job_pb2.Job]:
        """Jobs, oldest first; `states` by name ("RUNNING", ...), none for all. Without `full`,
        each job lacks its spec_json and its ranks' metrics (get() has them)."""
        view = job_pb2.JOB_VIEW_FULL if full else job_pb2.JOB_VIEW_BASIC
        request = job_pb2.ListJobsRequest(states=[job_pb2.JobState.Value(s.upper()) for s in states], view=view)
        jobs: List[job_pb2.Job] = []
        while len(jobs) < limit:
            request.page_size = min(1000, limit - len(jobs))
            page = self._call(self._jobs.ListJobs, request)
            jobs.extend(page.jobs)
            request.page_token = page.next_page_token
            if not request.page_token:
                break
        return jobs

    def watch(self, job_id: str) -> Iterator[job_pb2.JobUpdate]:
        """The job now, then each change (state transitions with reasons, rank status, metrics),
        until it ends."""
        return self._stream(self._jobs.WatchJob, job_pb2.WatchJobRequest(job_id=job_id))

    def wait(self, job_id: str, timeout: Optional[float] = None) -> job_pb2.Job:
        """Blocks until the job ends and returns it; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.state in FINAL_STATES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {state_name(job)} after {timeout} s")
            time.sleep(0.2)

    def cancel(self, job_id: str, reason: str = "") -> job_pb2.Job:
        """Stops every rank (SIGTERM, the spec's grace period, SIGKILL); the job ends CANCELLED."""
        return self._call(self._jobs.CancelJob, job_pb2.CancelJobRequest(job_id=job_id, reason=reason))

    def plan(self, job_id: str) -> plan_pb2.Plan:
        """The Plan compiled when a train or eval job was submitted (NOT_FOUND for other kinds)."""
        return self._call(self._jobs.GetJobPlan, job_pb2.GetJobPlanRequest(job_id=job_id))

    def metrics(self, job_id: str, names: Sequence[str] = (), ranks: Sequence[int] = ()) -> List[job_pb2.Metric]:
        """Every stored metric of the job, oldest first (all pages); only `names` and `ranks`
        when given."""
        request = job_pb2.ListJobMetricsRequest(job_id=job_id, names=list(names), ranks=list(ranks))
        rows: List[job_pb2.Metric] = []
        while True:
            page = self._call(self._jobs.ListJobMetrics, request)
            rows.extend(page.metrics)
            request.page_token = page.next_page_token
            if not page.more:
                return rows

    def logs(self, job_id: str, ranks: Sequence[int] = (), tail: int = 0, attempt: int = 0) -> List[LogLine]:
        """The ranks' logs as lines (every rank when `ranks` is empty; the last `tail` lines of each
        when tail > 0; the current attempt when attempt is 0)."""
        return list(self._log_lines(job_id, ranks, tail, attempt, follow=False))

    def follow_logs(self, job_id: str, ranks: Sequence[int] = (), tail: int = 0) -> Iterator[LogLine]:
        """As logs(), then each new line until the ranks end (`loomctl logs -f`)."""
        return self._log_lines(job_id, ranks, tail, 0, follow=True)

    def _log_lines(self, job_id, ranks, tail, attempt, follow) -> Iterator[LogLine]:
        request = job_pb2.GetJobLogsRequest(job_id=job_id, ranks=list(ranks), tail_lines=tail, follow=follow,
                                            attempt=attempt)
        partial: Dict[int, List] = {}  # rank -> [attempt, the unfinished line]
        for chunk in self._stream(self._jobs.GetJobLogs, request):
            held = partial.setdefault(chunk.rank, [chunk.attempt, ""])
            held[0] = chunk.attempt
            *lines, held[1] = (held[1] + chunk.data.decode("utf-8", "replace")).split("\n")
            for line in lines:
                yield LogLine(chunk.rank, chunk.attempt, line)
        for rank, (held_attempt, rest) in partial.items():
            if rest:
                yield LogLine(rank, held_attempt, rest)

    # ---- nodes ------------------------------------------------------------------------------------

    def nodes(self) -> List[node_pb2.Node]:
        """The node daemons attached to the planner."""
        return list(self._call(self._nodes.ListNodes, node_pb2.ListNodesRequest()).nodes)
