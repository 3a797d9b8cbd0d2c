"""What slurm-operator v1.2.1 renders from the Slinky resources a stack applied: slurm.conf,
cgroup.conf and each NodeSet pod's slurmd `--conf`. Pure: resources in (as the API server returns
them), text out. The Slinky stand-in (`slinky_standin.py`) hands these to the local Slurm, so what
runs here is what the operator would configure in production; nothing else gets in except what the
stack declared (the Controller's extraConf, its configFileRefs) and the local substitutions
`localenv/slurm.py` lists (where the daemons run: paths, ports, hosts, munge).

Follows slurm-operator v1.2.1:
- internal/builder/controllerbuilder/controller_config.go (buildSlurmConf, buildNodeSetConf,
  buildCgroupConf; cgroup.conf only when no configFileRefs ConfigMap has one),
- internal/builder/common/common.go (BuildMergedConfig: SlurmctldParameters, AuthInfo and
  AuthAltParameters merged with the extraConf's; GetSlurmNodeSetName),
- internal/builder/common/const.go (paths, ports, users),
- internal/builder/workerbuilder/worker_app.go (slurmdConfArgs: `Features=<nodeset>` merged with the
  NodeSet's extraConf, keys title-cased, sorted),
- internal/builder/accountingbuilder/accounting_config.go (buildSlurmdbdConf: slurmdbd.conf; the local Slurm
  replaces only LOCAL_DBD_KEYS),
- api/v1beta1/controller_keys.go, accounting_keys.go (ClusterName's default, Service names, PrimaryName).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

Resource = Mapping[str, Any]

SLURM_USER = "slurm"
SLURMD_USER = "root"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
SLURMCTLD_SPOOL_DIR = "/var/spool/slurmctld"
SLURMD_SPOOL_DIR = "/var/spool/slurmd"
LOG_DIR = "/var/log/slurm"
ETC_DIR = "/etc/slurm"
AUTH_TYPE, CRED_TYPE, AUTH_INFO, AUTH_ALT_TYPES = "auth/slurm", "cred/slurm", "use_client_ids", "auth/jwt"
JWT_PARAMETER = f"jwt_key={ETC_DIR}/jwt.key"
JWKS_PARAMETER = f"jwks={ETC_DIR}/jwks.json"


def _spec(r: Resource | None) -> Mapping[str, Any]:
    return (r or {}).get("spec") or {}


def cluster_name(controller: Resource) -> str:
    """Controller.ClusterName(): spec.clusterName, else `<namespace>_<name>`."""
    meta = controller["metadata"]
    return _spec(controller).get("clusterName") or f"{meta.get('namespace', '')}_{meta['name']}"


def controller_service(controller: Resource) -> str:
    """ServiceFQDNShort(): `<name>-controller.<namespace>`."""
    meta = controller["metadata"]
    return f"{meta['name']}-controller.{meta.get('namespace', '')}"


def nodeset_name(nodeset: Resource) -> str:
    """GetSlurmNodeSetName(): the pod template's hostname (first word, '-' trimmed), else the NodeSet's name."""
    hostname = ((_spec(nodeset).get("template") or {}).get("spec") or {}).get("hostname") or ""
    if hostname:
        return hostname.split()[0].strip("-")
    return nodeset["metadata"]["name"]


def nodesets_of(controller: Resource, nodesets: Iterable[Resource]) -> list[Resource]:
    """GetNodeSetsForController(): the NodeSets of the controller's namespace whose controllerRef names it."""
    meta = controller["metadata"]
    return [n for n in nodesets if n["metadata"].get("namespace", meta.get("namespace")) == meta.get("namespace")
            and (_spec(n).get("controllerRef") or {}).get("name") == meta["name"]]


def _parse_kv(conf: str) -> dict[str, str]:
    """parseSlurmConfKV(): lower-cased key -> value of single-valued `Key=Value` lines (comments and
    continuation lines handled; values with spaces skipped)."""
    out: dict[str, str] = {}
    logical = ""
    for line in conf.split("\n"):
        line = line.removesuffix("\r")
        if "#" in line:
            line = line[:line.index("#")]
        line = line.rstrip(" \t")
        if not line:
            continue
        if line.endswith("\\"):
            logical += line[:-1]
            continue
        logical += line
        key, sep, val = logical.strip().partition("=")
        key, val = key.strip(), val.strip()
        if sep and key and val and " " not in val and "\n" not in val:
            out[key.lower()] = val
        logical = ""
    if logical:
        key, sep, val = logical.strip().partition("=")
        if sep and key.strip() and val.strip() and " " not in val.strip():
            out[key.strip().lower()] = val.strip()
    return out


def merged_config(extra_conf: str, merge: Mapping[str, list[str]]) -> str:
    """BuildMergedConfig(): for each merged key the extraConf also sets, the union of both value lists
    (the operator's values win per option name), lower-cased options, sorted."""
    lines = []
    values = _parse_kv(extra_conf)
    for key in sorted(merge):
        val = values.get(key.lower())
        if val is None:
            continue
        merged = set(merge[key])
        seen = {m.split("=", 1)[0].lower() for m in merged}
        for v in val.split(","):
            if not v:
                continue
            opt = v.split("=", 1)[0].lower()
            if opt in seen:
                continue
            merged.add(v.lower())
            seen.add(opt)
        lines.append(f"{key}={','.join(sorted(merged))}")
    return "\n".join(lines)


def slurm_conf(controller: Resource, accounting: Resource | None, nodesets: Iterable[Resource],
               prolog: Iterable[str] = (), epilog: Iterable[str] = (),
               prolog_slurmctld: Iterable[str] = (), epilog_slurmctld: Iterable[str] = ()) -> str:
    """buildSlurmConf(): the operator's slurm.conf for `controller`, its Accounting (or None) and its NodeSets."""
    spec = _spec(controller)
    alt = [JWT_PARAMETER] + ([JWKS_PARAMETER] if spec.get("jwksKeyRef") else [])
    merge = {"SlurmctldParameters": ["enable_configless", "reconfig_on_restart"], "AuthInfo": [AUTH_INFO],
             "AuthAltParameters": alt}
    name = cluster_name(controller)
    host = f"{controller['metadata']['name']}-controller-0({controller_service(controller)})"
    lines = [
        "#", "### GENERAL ###",
        f"ClusterName={name}", f"SlurmUser={SLURM_USER}", f"SlurmctldHost={host}", f"SlurmctldPort={SLURMCTLD_PORT}",
        f"StateSaveLocation={SLURMCTLD_SPOOL_DIR}/{name}", f"SlurmdUser={SLURMD_USER}", f"SlurmdPort={SLURMD_PORT}",
        f"SlurmdSpoolDir={SLURMD_SPOOL_DIR}", "MaxNodeCount=1024",
        "#", "### LOGGING ###",
        f"SlurmctldLogFile={LOG_DIR}/slurmctld.log", f"SlurmSchedLogFile={LOG_DIR}/slurmctld.log",
        f"SlurmdLogFile={LOG_DIR}/slurmd.log",
        "#", "### PLUGINS & PARAMETERS ###",
        f"AuthType={AUTH_TYPE}", f"CredType={CRED_TYPE}", f"AuthAltTypes={AUTH_ALT_TYPES}",
        f"AuthAltParameters={','.join(merge['AuthAltParameters'])}", f"AuthInfo={','.join(merge['AuthInfo'])}",
        f"SlurmctldParameters={','.join(merge['SlurmctldParameters'])}",
    ]
    if (spec.get("metrics") or {}).get("enabled"):
        lines.append("MetricsType=metrics/openmetrics")
    lines += ["#", "### ACCOUNTING ###"]
    if accounting is not None:
        lines += ["AccountingStorageType=accounting_storage/slurmdbd",
                  f"AccountingStorageHost={accounting['metadata']['name']}-accounting",
                  f"AccountingStoragePort={SLURMDBD_PORT}"]
    else:
        lines.append("AccountingStorageType=accounting_storage/none")
    ctld_scripts = [f"PrologSlurmctld={ETC_DIR}/{f}" for f in sorted(prolog_slurmctld)] + \
        [f"EpilogSlurmctld={ETC_DIR}/{f}" for f in sorted(epilog_slurmctld)]
    if ctld_scripts:
        lines += ["#", "### SLURMCTLD PROLOG & EPILOG ###", "\n".join(ctld_scripts)]
    scripts = [f"Prolog={f}" for f in sorted(prolog)] + [f"Epilog={f}" for f in sorted(epilog)]
    if scripts:
        lines += ["#", "### PROLOG & EPILOG ###", "\n".join(scripts)]
    sets = []
    for ns in sorted(nodesets, key=lambda n: n["metadata"]["name"]):
        n = nodeset_name(ns)
        sets.append(f"NodeSet={n} Feature={n}")
        part = _spec(ns).get("partition") or {}
        if part.get("enabled"):
            sets.append(" ".join([f"PartitionName={n}", f"Nodes={n}", part.get("config") or ""]))
    if sets:
        lines += ["#", "### NODESET & PARTITION ###", "\n".join(sets)]
    lines += extra_and_merged(spec.get("extraConf") or "", merge)
    return "\n".join(lines + [""])


def extra_and_merged(extra: str, merge: Mapping[str, list[str]]) -> list[str]:
    """The two closing sections both of the operator's builders write: the CR's extraConf as given, then the
    keys it merges with the operator's own values (merged_config)."""
    lines = ["#", "### EXTRA CONFIG ###", extra] if extra else []
    merged = merged_config(extra, merge)
    return lines + (["#", "### MERGED CONFIG ###", merged] if merged else [])


def cgroup_conf() -> str:
    """buildCgroupConf(): written unless a configFileRefs ConfigMap brings its own cgroup.conf."""
    return "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"


def slurmd_conf(nodeset: Resource) -> str:
    """slurmdConfArgs(): the `--conf` of the NodeSet's slurmd, `Features=<nodeset>` merged with the
    NodeSet's extraConf (space-separated Key=Value items; Feature and Features are one key)."""
    conf: dict[str, str] = {"Features": nodeset_name(nodeset)}
    for item in (_spec(nodeset).get("extraConf") or "").split(" ") if _spec(nodeset).get("extraConf") else []:
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"malformed --conf item: {item}")
        key = key[:1].upper() + key[1:].lower()  # cases.Title(language.English)
        if key in ("Features", "Feature"):
            key = "Features"
        conf[key] = f"{conf[key]},{val}" if key in conf else val
    return " ".join(sorted(f"{k}={v}" for k, v in conf.items()))


# --- the local Slurm: the operator's files where this machine's daemons find them ---------------------

# Keys of the operator's slurm.conf whose values the local Slurm must change, because its daemons run as
# processes of one machine, not as pods: where they listen and find each other, where they keep state and
# logs (one slurmd per NodeSet pod on one filesystem), and munge for authentication (the Slurm root's
# clients have no slurm.key). Nothing else of the operator's is changed, and nothing is added.
LOCAL_KEYS = frozenset({
    "SlurmctldHost", "SlurmctldPort", "StateSaveLocation", "SlurmdSpoolDir", "SlurmctldLogFile", "SlurmSchedLogFile",
    "SlurmdLogFile", "AuthType", "CredType", "AuthInfo", "AuthAltParameters",
    "AccountingStorageHost", "AccountingStoragePort",
})
# slurmdbd.conf's where-it-runs settings (host, ports, auth, log); everything else is the operator's.
LOCAL_DBD_KEYS = frozenset({
    "DbdHost", "DbdPort", "AuthType", "AuthInfo", "AuthAltParameters", "StorageHost", "StoragePort", "LogFile",
})


def slurmdbd_conf(accounting: Resource, storage_pass: str) -> str:
    """buildSlurmdbdConf() (internal/builder/accountingbuilder/accounting_config.go): slurmdbd.conf for an
    Accounting, its storage password read from `spec.storageConfig.passwordKeyRef` (the caller reads it)."""
    spec = _spec(accounting)
    storage = spec.get("storageConfig") or {}
    alt = [JWT_PARAMETER] + ([JWKS_PARAMETER] if spec.get("jwksKeyRef") else [])
    merge = {"AuthInfo": [AUTH_INFO], "AuthAltParameters": alt}
    lines = [
        "#", "### GENERAL ###",
        f"DbdHost={accounting['metadata']['name']}-0",  # Accounting.PrimaryName() (api/v1beta1/accounting_keys.go)
        f"DbdPort={SLURMDBD_PORT}", f"SlurmUser={SLURM_USER}",
        "#", "### PLUGINS & PARAMETERS ###",
        f"AuthType={AUTH_TYPE}", f"AuthAltTypes={AUTH_ALT_TYPES}",
        f"AuthAltParameters={','.join(merge['AuthAltParameters'])}", f"AuthInfo={','.join(merge['AuthInfo'])}",
        "#", "### STORAGE ###",
        "StorageType=accounting_storage/mysql",
        f"StorageHost={storage.get('host', '')}", f"StoragePort={storage.get('port', 0)}",
        f"StorageUser={storage.get('username', '')}", f"StorageLoc={storage.get('database', '')}",
        f"StoragePass={storage_pass}",
        "#", "### LOGGING ###",
        "LogFile=/dev/null",
    ]
    lines += extra_and_merged(spec.get("extraConf") or "", merge)
    return "\n".join(lines) + "\n"


def localize(conf: str, values: Mapping[str, str], keys: frozenset[str] = LOCAL_KEYS) -> str:
    """`conf` (the operator's slurm.conf, or slurmdbd.conf with `keys` LOCAL_DBD_KEYS) with the values of
    `keys` replaced by `values`, wherever a line sets them (the merged section too). Raises for a key outside
    `keys`."""
    unknown = set(values) - keys
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not where-it-runs settings; declare them in the stack")
    lower = {k.lower(): v for k, v in values.items()}
    out = []
    for line in conf.split("\n"):
        key, sep, _ = line.partition("=")
        if sep and " " not in key and key.lower() in lower:
            line = f"{key}={lower[key.lower()]}"
        out.append(line)
    return "\n".join(out)


def conf_keys(conf: str) -> list[str]:
    """The keys a slurm.conf sets, in order (a line `NodeSet=a Feature=a` sets NodeSet; comments skipped)."""
    out = []
    for line in conf.split("\n"):
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            out.append(line.split("=", 1)[0].strip())
    return out


def synthetic_controller(cluster: str, extra_conf: str, namespace: str = "slurm", name: str = "slurm") -> dict:
    """A Controller as a stack declares one (for a local Slurm started without a stack: tests)."""
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterName": cluster, "extraConf": extra_conf}}


def synthetic_nodeset(name: str, controller: str = "slurm", namespace: str = "slurm", extra_conf: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"controllerRef": {"name": controller}, "extraConf": extra_conf, "partition": {"enabled": False}}}
