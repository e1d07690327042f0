"""The `ddtreectl status --json` schema in words, for --help and docs.

A module of its own so the CLI can put it into --help without importing the status machinery.
"""

SCHEMA = "ddtreectl.status/1"

STATUS_JSON_SCHEMA = """\
{"schema": "ddtreectl.status/1", "inventory": PATH,
 "generated_at": ISO-8601, "deadline_s", "elapsed_ms", "exit_code",
 "ok" (exit_code is 0), "error": null | {"message", "hint", "exit_code"} (no host probed),
 "summary": {"hosts", "answered", "unreachable", "refused",
             "timeout", "failed"},
 "hosts": [{"name", "host" (= name), "ok" (answered), "address",
   "port", "role", "transport",
   "outcome": ok|unreachable|refused|timeout|failed,
   "error": null | {"message", "hint", "exit_code"},
   "connect_ms", "probe_ms",
   "connection": null (local/no answer) | reused | new | paramiko,
   "identity": {"hostname", "machine_id", "boot_id", "uptime_s",
                "kernel", "user", "pid1"},
   "gpus": {"status": ok|no-devices|missing|timeout|error|not-run,
     "expected", "found", "busy" (null: unknown), "summary",
     "detail", "duration_ms",
     "devices": [{"index", "uuid", "name", "memory_used_mib",
       "memory_total_mib", "utilization_pct", "persistence_mode",
       "compute_cap", "busy"}],
     "processes": null | [{"gpu_uuid", "pid", "process_name",
                           "used_memory_mib"}]},
   "service": null (no service profile) | {"profile", "unit",
     "state": KIND, "words", "known", "load_state", "active_state",
     "sub_state", "unit_file_state", "result", "exec_main_status",
     "n_restarts", "active_since", "need_daemon_reload", "main_pid",
     "serving": true (/health 200) | false (port not open, /health
       503 while loading, another status, no answer within 5 s) | null
       (not asked: unit not active, no port here, no curl/python3),
     "health": null | {"port", "listening", "http_status"}},
   "release": {"root", "root_exists", "current", "current_path",
     "current_exists", "build_stamp", "stamp", "releases",
     "running", "restart_pending"},
   "mode": null (no state/mode.json: prod) | {"mode": prod|dev|unknown,
     "holder", "reason", "since", "expires", "expired", "unit",
     "forced"},
   "disk": null | {"path", "mount", "total_bytes", "free_bytes",
                   "used_pct"},
   "state_files": {PATH: JSON or text}, "warnings": [TEXT]}]}
KIND: running starting restarting reloading stopping failed
  stopped-enabled stopped-disabled stopped-static masked
  not-installed broken unknown.
identity, gpus, service, release, mode, disk and state_files are null
when the host did not answer. Unknown values are null, never 0.
connection: reused = an OpenSSH master of an earlier command served
the probe; new = one was started; paramiko = a connection of its own.
connect_ms is null when the connection is inside probe_ms (OpenSSH)."""
