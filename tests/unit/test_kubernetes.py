"""deploy/kubernetes/: every manifest is valid against the Kubernetes API schemas (those that
kubernetes-validate ships: no cluster, no network), strictly (an unknown or misspelt field
fails), and says what the README promises: a CronJob of incremental syncs, a training pod
with mcsync as its sidecar, an Indexed Job of shards, a DaemonSet keeping a node's cache, a
training Job that restores its latest checkpoint and warms its dataset first, and a RayJob (its
pod templates checked as PodTemplates: KubeRay's schema is not shipped); every mcsync command
line in them (a container's command, or a line of its shell script) parses with the real
command."""

from __future__ import annotations

import copy
import shlex
import socket
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from mcsync.cli.main import cli

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
# Native sidecars (an init container with restartPolicy: Always) are GA since 1.33.
KUBERNETES_VERSION = "1.33.0"
GRACE_DEFAULT_S = 20.0


def documents(*, kuberay: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """The manifests of Kubernetes' own kinds, or (``kuberay``) KubeRay's (``ray.io``), for
    which kubernetes-validate has no schema."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["apiVersion"].startswith("ray.io/") == kuberay:
                found.append((path.name, doc))
    return found


def by_kind(kind: str, file: str | None = None) -> dict[str, Any]:
    (doc,) = [d for name, d in documents() if d["kind"] == kind and file in (None, name)]
    return doc


def validate(doc: dict[str, Any]) -> None:
    """Raises kubernetes_validate.ValidationError for an invalid document, and
    SchemaNotFoundError for a kind or apiVersion the schemas do not know (which the command-line
    tool only warns about)."""
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("validation tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_manifests_are_there() -> None:
    kinds = sorted(d["kind"] for _, d in documents())
    assert kinds == ["CronJob", "DaemonSet", "Job", "Job", "Pod", "Secret"]
    assert (DEPLOY / "README.md").exists()


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_every_manifest_is_valid(name: str, doc: dict[str, Any], offline: None) -> None:
    validate(doc)


@pytest.mark.parametrize("mistake", ["misspelt field", "wrong type", "missing field",
                                     "an indexed job's field misspelt"])
def test_an_invalid_indexed_job_is_refused(mistake: str, offline: None) -> None:
    doc = copy.deepcopy(by_kind("Job", "indexed-job.yaml"))
    spec = doc["spec"]
    if mistake == "misspelt field":
        spec["completionsMode"] = spec.pop("completionMode")
    elif mistake == "wrong type":
        spec["completions"] = "eight"
    elif mistake == "missing field":
        del spec["template"]["spec"]["containers"]
    else:
        spec["backoffLimitPerIndexes"] = spec.pop("backoffLimitPerIndex")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)


@pytest.mark.parametrize("mistake", ["misspelt field", "wrong type", "missing field",
                                     "unknown kind"])
def test_an_invalid_manifest_is_refused(mistake: str, offline: None) -> None:
    """The check above can fail: the validator is not one that passes everything."""
    doc = copy.deepcopy(by_kind("CronJob"))
    spec = doc["spec"]
    if mistake == "misspelt field":
        spec["concurencyPolicy"] = spec.pop("concurrencyPolicy")
    elif mistake == "wrong type":
        spec["jobTemplate"]["spec"]["backoffLimit"] = "two"
    elif mistake == "missing field":
        del spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    else:
        doc["kind"] = "CronJobs"
    with pytest.raises((kubernetes_validate.ValidationError,
                        kubernetes_validate.utils.SchemaNotFoundError)):
        validate(doc)


def mcsync_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in pod_spec.get("initContainers", []) + pod_spec["containers"]
                if c["name"] == "mcsync"]
    return found


def known_options(command: str) -> set[str]:
    cmd = cli.commands[command]
    return {opt for p in cmd.params if isinstance(p, click.Option) for opt in p.opts}


def check_command(container: dict[str, Any]) -> list[str]:
    """The container runs `mcsync sync SRC DST` with options the command has; returns args."""
    assert container["command"] == ["mcsync"]
    args: list[str] = container["args"]
    assert args[0] == "sync" and len([a for a in args[1:3] if not a.startswith("-")]) == 2
    unknown = {a for a in args if a.startswith("-")} - known_options("sync")
    assert not unknown, f"options mcsync sync does not have: {unknown}"
    assert container["image"] == "ghcr.io/example/mcsync:0.1.0"
    return args


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def check_credentials(container: dict[str, Any], prefixes: tuple[str, ...]) -> None:
    env = env_of(container)
    secret = by_kind("Secret")
    for name, entry in env.items():
        if name.startswith(("MCSYNC_META_", "AWS_")):
            assert "value" not in entry, f"{name}: credentials come from the Secret"
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret[
                "stringData"]
    for prefix in prefixes:
        assert any(n.startswith(prefix) for n in env), prefix
    assert {"MCSYNC_META_ACCESS_KEY_ID", "MCSYNC_META_SECRET_ACCESS_KEY"} <= set(env)


def mounted_on_empty_dir(pod_spec: dict[str, Any], container: dict[str, Any],
                         path: str) -> bool:
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    return any(m["mountPath"] == path and "emptyDir" in volumes[m["name"]]
               for m in container["volumeMounts"])


def test_the_cronjob_runs_a_scheduled_incremental_sync() -> None:
    cron = by_kind("CronJob")
    spec = cron["spec"]
    assert spec["schedule"] == "*/15 * * * *" and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    container = mcsync_container(pod)
    args = check_command(container)
    assert "--quiet" in args and args[args.index("--report") + 1].startswith("/")
    assert args[args.index("--metrics-file") + 1].endswith(".prom")  # node_exporter's rule
    check_credentials(container, ("MCSYNC_META_", "AWS_"))
    state = env_of(container)["XDG_STATE_HOME"]["value"]
    assert mounted_on_empty_dir(pod, container, state)
    assert pod["terminationGracePeriodSeconds"] > GRACE_DEFAULT_S
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_the_training_pod_runs_mcsync_as_a_watching_sidecar() -> None:
    pod = by_kind("Pod")
    spec = pod["spec"]
    container = mcsync_container(spec)
    assert container.get("restartPolicy") == "Always"  # a native sidecar
    args = check_command(container)
    assert args[:3] == ["sync", "/checkpoints", "meta://ckpt-store/llama-ft/run-7/"]
    assert "--watch" in args
    assert int(args[args.index("--keep-last") + 1]) >= 1  # retention at the target
    assert args[args.index("--metrics-addr") + 1] == "0.0.0.0:9108"
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 9108)
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9108"
    check_credentials(container, ("MCSYNC_META_",))
    assert mounted_on_empty_dir(spec, container, env_of(container)["XDG_STATE_HOME"]["value"])
    grace = float(args[args.index("--grace") + 1]) if "--grace" in args else GRACE_DEFAULT_S
    assert spec["terminationGracePeriodSeconds"] > grace
    trainer = [c for c in spec["containers"] if c["name"] != "mcsync"]
    assert trainer, "a training container beside the sidecar"
    shared = {m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/checkpoints"}
    assert all(shared & {m["name"] for m in c["volumeMounts"]} for c in trainer)
    for c in [container, *trainer]:
        assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]


def test_the_indexed_job_runs_one_shard_per_index() -> None:
    job = by_kind("Job", "indexed-job.yaml")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] > 1 and 1 <= spec["parallelism"] <= spec["completions"]
    assert spec["backoffLimitPerIndex"] >= 1
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = mcsync_container(pod)
    args = check_command(container)
    assert args[args.index("--shard") + 1] == "auto"
    env = env_of(container)
    # Kubernetes sets JOB_COMPLETION_INDEX, not the count: the template says it, the same.
    assert env["JOB_COMPLETIONS"]["value"] == str(spec["completions"])
    assert "JOB_COMPLETION_INDEX" not in env
    check_credentials(container, ("MCSYNC_META_", "AWS_"))
    assert mounted_on_empty_dir(pod, container, env["XDG_STATE_HOME"]["value"])
    assert pod["terminationGracePeriodSeconds"] > GRACE_DEFAULT_S
    # 2 (configuration) fails the Job; 1 and 3 are retried per index; 130 is not counted
    rules = {tuple(r["onExitCodes"]["values"]): r["action"]
             for r in spec["podFailurePolicy"]["rules"] if "onExitCodes" in r}
    assert rules == {(2,): "FailJob", (130,): "Ignore"}
    assert container["resources"]["requests"] and container["resources"]["limits"]


def test_shard_auto_in_the_job_s_environment_names_its_shard() -> None:
    """What the pod's environment gives --shard auto is a shard it accepts."""
    from mcsync.state.shard import parse

    spec = by_kind("Job", "indexed-job.yaml")["spec"]
    count = spec["completions"]
    env = {"JOB_COMPLETIONS": env_of(mcsync_container(spec["template"]["spec"]))[
        "JOB_COMPLETIONS"]["value"]}
    for index in range(count):  # Kubernetes numbers the pods 0 .. completions - 1
        assert parse("auto", env | {"JOB_COMPLETION_INDEX": str(index)}) == (index, count)


def test_the_readme_shows_what_the_manifests_run() -> None:
    readme = (DEPLOY.parents[1] / "README.md").read_text()
    assert "deploy/kubernetes" in readme and "## Kubernetes" in readme
    local = (DEPLOY / "README.md").read_text()
    assert "ghcr.io/example/mcsync:0.1.0" in local and "placeholder" in local
    for _, doc in documents():
        if doc["kind"] == "Secret":
            assert set(doc["stringData"].values()) - {"REPLACE-ME"} <= {
                "https://meta-storage.example.internal", "us-east-1"}, "placeholders only"
    section = readme.split("## Kubernetes", 1)[1].split("\n## ", 1)[0]
    for name in ("cronjob.yaml", "training-with-sidecar.yaml", "--watch", "--metrics-addr",
                 "--metrics-file"):
        assert name in section, name
    indexed = readme.split("### Kubernetes Indexed Jobs", 1)[1].split("\n## ", 1)[0]
    for name in ("indexed-job.yaml", "--shard auto", "JOB_COMPLETION_INDEX", "JOB_COMPLETIONS",
                 "completionMode: Indexed"):
        assert name in indexed, name
    assert "indexed-job.yaml" in local


# -- every mcsync command line parses ----------------------------------------------------------

SHELL_OPERATORS = {"||", "&&", ";", "|", "&", "(", ")", "then", "do", "else", "exec", "!"}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec", {})
    if doc["kind"] == "Pod":
        return spec  # type: ignore[no-any-return]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec.get("template", {}).get("spec")  # type: ignore[no-any-return]


def in_script(script: str) -> list[list[str]]:
    """The mcsync command lines of a shell script: ``mcsync`` where a command starts (a line's
    beginning, after ``||``, ``;``, ``then``, ...) up to the next operator; quoted text is
    never one (``echo "mcsync cache warm: exit $?"``)."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        for i, word in enumerate(words):
            if word == "mcsync" and (i == 0 or words[i - 1] in SHELL_OPERATORS):
                end = next((j for j in range(i + 1, len(words)) if words[j] in SHELL_OPERATORS),
                           len(words))
                found.append(words[i:end])
    return found


def command_lines() -> list[tuple[str, list[str], dict[str, str]]]:
    """Every mcsync command line of every container: (file:container, argv, its plain env)."""
    found = []
    for file, doc in documents():
        spec = pod_spec(doc)
        if spec is None:
            continue
        for c in spec.get("initContainers", []) + spec["containers"]:
            env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            command, args = c.get("command", []), c.get("args", [])
            if command == ["mcsync"]:
                found.append((f"{file}:{c['name']}", ["mcsync", *args], env))
            elif command[:1] in (["/bin/sh"], ["sh"]) and "-c" in command:
                found += [(f"{file}:{c['name']}", argv, env)
                          for argv in in_script((command + args)[command.index("-c") + 1])]
    return found


def parse(argv: list[str]) -> click.Context:
    """``argv`` parsed by the real command, down to its subcommand, as running it would (the
    option types' own checks included) but running nothing; raises click's UsageError. (The
    groups take no options of their own before a subcommand, so each word until the command
    is a subcommand's name.)"""
    ctx = click.Context(cli, info_name="mcsync")
    command: click.Command = cli
    words = argv[1:]
    while isinstance(command, click.Group):
        if not words:
            raise click.UsageError("a command is missing", ctx)
        name, words = words[0], words[1:]
        found = command.get_command(ctx, name)
        if found is None:
            raise click.UsageError(f"no such command: {name}", ctx)
        if isinstance(found, click.Group):
            ctx = click.Context(found, info_name=name, parent=ctx)
        command = found
    return command.make_context(name, words, parent=ctx)


LINES = command_lines()


def test_the_command_lines_are_found() -> None:
    runs = sorted(" ".join(argv[1:3]) if argv[1] == "cache" else argv[1] for _, argv, _ in LINES)
    assert runs == ["cache verify", "cache warm", "cache warm", "sync", "sync", "sync", "sync",
                    "sync"]
    assert in_script('x || mcsync a "b c"; echo "mcsync no" && exec mcsync d\nmcsync e') == [
        ["mcsync", "a", "b c"], ["mcsync", "d"], ["mcsync", "e"]]


@pytest.mark.parametrize(("where", "argv", "env"), LINES, ids=[w for w, _, _ in LINES])
def test_every_mcsync_command_line_parses(where: str, argv: list[str], env: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():  # options that default to a variable see the pod's
        monkeypatch.setenv(name, value)
    parse(argv)


@pytest.mark.parametrize("argv", [
    ["mcsync", "sync", "a/", "b/", "--latest-checkpoints"],
    ["mcsync", "sync", "a/", "b/", "--concurrency", "many"],
    ["mcsync", "sync", "a/"],
    ["mcsync", "synk", "a/", "b/"],
])
def test_a_command_line_the_command_does_not_take_is_refused(argv: list[str]) -> None:
    with pytest.raises(click.UsageError):
        parse(argv)


def volume_at(spec: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    (name,) = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in spec["volumes"] if v["name"] == name]
    return volume  # type: ignore[no-any-return]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_daemonset_keeps_the_node_cache_on_a_host_directory() -> None:
    daemonset = by_kind("DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    container = mcsync_container(spec)
    lines = [argv for where, argv, _ in LINES if where == "node-cache-daemonset.yaml:mcsync"]
    assert [argv[1:3] for argv in lines] == [["cache", "warm"], ["cache", "verify"]]
    for argv in lines:
        cache = volume_at(spec, container, option(argv, "--cache-dir"))
        assert cache["hostPath"] == {"path": "/var/cache/mcsync", "type": "DirectoryOrCreate"}
    assert option(lines[0], "--max-size")  # the limit, recorded in the directory for all
    assert env_of(container)["MCSYNC_CACHE_DIR"]["value"] == option(lines[0], "--cache-dir")
    check_credentials(container, ("MCSYNC_META_",))
    assert container["resources"]["requests"] and container["resources"]["limits"]
    training = by_kind("Job", "training-job.yaml")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == training["nodeSelector"]  # on the nodes that train
    assert spec["tolerations"] == training["tolerations"]


def test_the_training_job_restores_its_checkpoint_and_warms_its_data_first() -> None:
    job = by_kind("Job", "training-job.yaml")["spec"]
    spec = job["template"]["spec"]
    init = {c["name"]: c for c in spec["initContainers"]}
    assert list(init) == ["restore-checkpoint", "warm-dataset", "mcsync"]  # in this order
    assert [c.get("restartPolicy") for c in init.values()] == [None, None, "Always"]
    (trainer,) = spec["containers"]
    lines = {where.split(":")[1]: argv for where, argv, _ in LINES
             if where.startswith("training-job.yaml:")}

    restore = lines["restore-checkpoint"]
    assert restore[1] == "sync" and "--latest-checkpoint" in restore
    assert "--delete" not in restore
    sidecar = lines["mcsync"]
    assert sidecar[2:4] == [restore[3], restore[2]] and "--watch" in sidecar  # the way back
    checkpoints = volume_at(spec, trainer, restore[3])
    assert volume_at(spec, init["restore-checkpoint"], restore[3]) == checkpoints
    assert not [m for m in init["restore-checkpoint"]["volumeMounts"] if m.get("readOnly")]

    warm = lines["warm-dataset"]
    assert warm[1:3] == ["cache", "warm"]
    cache = volume_at(spec, init["warm-dataset"], option(warm, "--cache-dir"))
    daemonset = by_kind("DaemonSet")["spec"]["template"]["spec"]
    node_cache = [v for v in daemonset["volumes"] if "hostPath" in v]
    assert cache["hostPath"]["path"] == node_cache[0]["hostPath"]["path"]
    assert volume_at(spec, trainer, env_of(trainer)["MCSYNC_CACHE_DIR"]["value"]) == cache

    for c in init.values():
        check_credentials(c, ("MCSYNC_META_",))
        assert c["resources"]["requests"] and c["resources"]["limits"]
    assert spec["restartPolicy"] == "Never"
    rules = job["podFailurePolicy"]["rules"]
    assert {"action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    assert spec["terminationGracePeriodSeconds"] > GRACE_DEFAULT_S
def test_the_rayjob_runs_the_sync_on_ray_with_keys_from_the_secret(offline: None) -> None:
    """The RayJob's entrypoint is `mcsync sync SRC DST --executor ray` with options the command
    has; its head and worker pod templates are valid PodTemplates; every key a pod holds comes
    from the Secret, and the workers hold only keys (where to write comes from the driver)."""
    import shlex

    ((_, job),) = documents(kuberay=True)
    assert job["kind"] == "RayJob" and job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    args = shlex.split(spec["entrypoint"])
    assert args[:2] == ["mcsync", "sync"] and not any(a.startswith("-") for a in args[2:4])
    assert args[args.index("--executor") + 1] == "ray"
    unknown = {a for a in args if a.startswith("-")} - known_options("sync")
    assert not unknown, f"options mcsync sync does not have: {unknown}"
    assert "runtimeEnvYAML" not in spec  # Ray shows a runtime env: no keys there
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    (group,) = cluster["workerGroupSpecs"]
    workers = int(args[args.index("--workers") + 1])
    per_pod = int(group["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"])
    assert head["rayStartParams"]["num-cpus"] == "0"  # the actors go to the worker pods
    assert workers == group["replicas"] * per_pod
    secret = by_kind("Secret")
    for template in (head["template"], group["template"]):
        validate({"apiVersion": "v1", "kind": "PodTemplate",
                  "metadata": {"name": "ray-pod"}, "template": template})
        (container,) = template["spec"]["containers"]
        assert container["image"] == "ghcr.io/example/mcsync-ray:0.1.0"
        assert container["resources"]["requests"] and container["resources"]["limits"]
        for name, entry in env_of(container).items():
            if name.startswith(("MCSYNC_META_", "AWS_")):
                ref = entry["valueFrom"]["secretKeyRef"]
                assert ref["name"] == secret["metadata"]["name"]
                assert ref["key"] in secret["stringData"]
    worker_env = set(env_of(group["template"]["spec"]["containers"][0]))
    assert worker_env == {"MCSYNC_META_ACCESS_KEY_ID", "MCSYNC_META_SECRET_ACCESS_KEY",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    bad = copy.deepcopy(group["template"])
    bad["spec"]["containers"][0]["envFrom"] = "mcsync-credentials"  # wrong type: refused
    with pytest.raises(kubernetes_validate.ValidationError):
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                  "template": bad})


def test_the_readme_shows_the_ray_executor() -> None:
    readme = (DEPLOY.parents[1] / "README.md").read_text()
    section = readme.split("## Ray", 1)[1].split("\n## ", 1)[0]
    for name in ("--executor ray", "ray job submit", "rayjob.yaml", "--ray-address",
                 "pip install 'mcsync[ray]'", 'executor="ray"'):
        assert name in section, name
    assert "rayjob.yaml" in (DEPLOY / "README.md").read_text()
