"""Pushing a finished run to the HuggingFace Hub, so that it outlives the disk it was trained on.

`push_run(run, "owner/name")` uploads the run directory — config, status, metrics, evals, transcripts,
comparison, and `final/` (the trained weights or adapter, with the tokenizer) — into the folder
`runs/<run_id>/` of the model repo `owner/name` (created private when it does not exist), through
huggingface_hub's public API (`HfApi.create_repo`, `HfApi.upload_folder`) with the token it finds
(`HF_TOKEN`, e.g. a Space secret, or a `hf auth login`). One repo holds as many runs as the owner pushes.

`plan_push` decides everything before the network is touched (which run, which files, where), so it can be
checked without the Hub; the two calls to the Hub come after it. No torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.utils import HFValidationError, filter_repo_objects, validate_repo_id

from training.run.directory import FINISHED_STATUSES, RunDir

# Half-written files a run directory can hold while or after it is written: temp folders (`.final-*`) and
# files being replaced (`.status.json.*.tmp`). Never pushed (nor .git or .cache: upload_folder adds those).
HUB_IGNORE = [".*", "*/.*", "*.tmp"]
REPO_FOLDER = "runs"  # a run goes to <repo>/runs/<run_id>/


class HubPushError(RuntimeError):
    """The run cannot be pushed (not finished, bad repo name) or the Hub refused or could not be reached."""


@dataclass(frozen=True)
class PushPlan:
    """What `push_run` will upload: `files` (relative to `folder`) into `path_in_repo` of `repo_id`."""

    repo_id: str
    folder: Path
    path_in_repo: str
    files: tuple[str, ...]
    has_weights: bool
    commit_message: str


def plan_push(run: RunDir, repo_id: str) -> PushPlan:
    """Check that `run` has finished and `repo_id` is a valid repo name, and list the files to push.

    Raises:
        HubPushError: the repo name is invalid, or the run is still training (or never started)."""
    repo_id = (repo_id or "").strip()
    if not repo_id:
        raise HubPushError("Name the Hub repo to push to, e.g. your-name/sqlenv-runs.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubPushError(f"Invalid Hub repo name {repo_id[:100]!r}: {exc}") from None
    status = run.read_status().get("status")
    if status not in FINISHED_STATUSES:
        raise HubPushError(f"Run {run.run_id} is {status}: push it once it has finished.")
    every = sorted(p.relative_to(run.path).as_posix() for p in run.path.rglob("*") if p.is_file())
    files = tuple(filter_repo_objects(every, ignore_patterns=HUB_IGNORE))
    return PushPlan(
        repo_id=repo_id,
        folder=run.path,
        path_in_repo=f"{REPO_FOLDER}/{run.run_id}",
        files=files,
        has_weights=any(f.startswith("final/") for f in files),
        commit_message=f"SQLEnv run {run.run_id} ({status})",
    )


def push_run(run: RunDir, repo_id: str, token: str | None = None, private: bool = True,
             endpoint: str | None = None) -> str:
    """Push a finished run to `<repo_id>/runs/<run_id>/` and return the commit's URL.

    Args:
        run: the run directory.
        repo_id: the model repo, `owner/name`; created (private by default) when it does not exist.
        token: a Hub token with write access (default: huggingface_hub's own lookup, `HF_TOKEN` first).
        private: the visibility of a repo this call creates (an existing repo keeps its own).
        endpoint: the Hub's URL (default `$HF_ENDPOINT` or https://huggingface.co).

    Raises:
        HubPushError: from `plan_push`, or the Hub could not be reached or refused (the message says which).
    """
    plan = plan_push(run, repo_id)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(plan.repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=plan.repo_id, folder_path=plan.folder, path_in_repo=plan.path_in_repo, repo_type="model",
            commit_message=plan.commit_message, ignore_patterns=HUB_IGNORE,
        )
    except Exception as exc:  # network, auth, quota: say which, keep serving
        raise HubPushError(f"Could not push {run.run_id} to {plan.repo_id}: {type(exc).__name__}: {exc}") from exc
    return str(getattr(commit, "commit_url", commit))
