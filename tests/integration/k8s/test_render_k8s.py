"""`ddpctl render k8s`: the manifests read back by a YAML 1.1 reader (PyYAML, as Kubernetes'
go-yaml reads them) and validated with python3-jsonschema against the Kubernetes schemas
committed under packaging/k8s/schemas/ (a subset written from the API reference; see there)."""
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from ddptest import DDPCTL, SOURCE_DIR, write_job

SCHEMAS = SOURCE_DIR / "packaging" / "k8s" / "schemas"
SCHEMA_BY_KIND = {"ConfigMap": "configmap-v1.json", "Service": "service-v1.json", "Job": "job-batch-v1.json"}
EXAMPLE_ARGS = ["--image", "registry.example.com/ddpctl-train:0.1.0", "--gpus-per-pod", "8"]


def render(job, *args):
    r = subprocess.run([DDPCTL, "render", "k8s", str(job), *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def validator(kind):
    schema = json.loads((SCHEMAS / SCHEMA_BY_KIND[kind]).read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def validate_all(text):
    objs = list(yaml.safe_load_all(text))
    for o in objs:
        errors = sorted(validator(o["kind"]).iter_errors(o), key=str)
        assert not errors, f"{o['kind']}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
    return {o["kind"]: o for o in objs}


def test_rendered_manifests_validate_and_wire_pods_to_pod_0(tmp_path):
    text = "name: Bert_Large\nnnodes: 3\nnproc_per_node: 4\ncommand: [python3, train.py]\nenv: {SEED: \"1\"}\n"
    job = write_job(tmp_path, text)
    rc, out, err = render(job, "--image", "reg.example/bert:1", "--namespace", "ml", "--active-deadline", "7200")
    assert rc == 0, err
    by_kind = validate_all(out)
    assert sorted(by_kind) == ["ConfigMap", "Job", "Service"]
    svc, k8s_job, cm = by_kind["Service"], by_kind["Job"], by_kind["ConfigMap"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert k8s_job["spec"]["completionMode"] == "Indexed" and k8s_job["spec"]["completions"] == 3
    assert k8s_job["metadata"]["namespace"] == "ml" and k8s_job["spec"]["activeDeadlineSeconds"] == 7200
    pod = k8s_job["spec"]["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] == "bert-large"
    labels = k8s_job["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["DDP_K8S_NODES"] == "bert-large-0.bert-large,bert-large-1.bert-large,bert-large-2.bert-large"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert mounts["token"]["mountPath"] == "/etc/ddpctl/token" and mounts["token"]["subPath"] == "token"
    assert vols["token"]["secret"] == {"secretName": "ddpctl-token", "defaultMode": 0o400}
    assert vols["job"]["configMap"]["name"] == cm["metadata"]["name"] and mounts["job"]["mountPath"] == "/etc/ddpctl/job"
    # The job file travels as written, and is what pod 0's launcher is given.
    assert cm["data"]["job.yaml"] == text
    script = c["command"][2]
    assert c["command"][:2] == ["/bin/sh", "-c"] and "/etc/ddpctl/job/job.yaml" in script
    assert subprocess.run(["/bin/sh", "-n", "-c", script]).returncode == 0


def test_the_schemas_refuse_what_kubernetes_would(tmp_path):
    job = write_job(tmp_path, "name: t\nnnodes: 2\ncommand: [x]\n")
    rc, out, err = render(job, "--image", "i")
    assert rc == 0, err
    objs = {o["kind"]: o for o in yaml.safe_load_all(out)}
    broken = [
        ("Job", lambda o: o["spec"].update(completionMode="indexed")),
        ("Job", lambda o: o["spec"]["template"]["spec"].update(restartPolicy="Always")),
        ("Job", lambda o: o["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort=70000)),
        ("Job", lambda o: o["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicy_="Always")),
        ("Service", lambda o: o["spec"].update(publishNotReadyAddresses="true")),
        ("Service", lambda o: o["metadata"].update(name="9-starts-with-a-digit")),
        ("ConfigMap", lambda o: o["data"].update({"job.yaml": 1})),
    ]
    for kind, mutate in broken:
        o = json.loads(json.dumps(objs[kind]))
        mutate(o)
        assert list(validator(kind).iter_errors(o)), f"{kind} schema accepted a broken object"


def test_errors_name_the_fix(tmp_path):
    rc, _, err = render(write_job(tmp_path, "nnodes: 1:4\ncommand: [x]\n"), "--image", "i")
    assert rc == 2 and "an Indexed Job has a fixed number of pods; pass --nodes N" in err, err
    rc, _, err = render(write_job(tmp_path, "name: 7up\ncommand: [x]\n", name="b.yaml"), "--image", "i")
    assert rc == 2 and "pass --name" in err, err
    rc, _, err = render(write_job(tmp_path, "command: [x]\n", name="c.yaml"))
    assert rc != 0 and "--image" in err, err
    rc, _, err = render(write_job(tmp_path, "command: [x]\nbogus: 1\n", name="d.yaml"), "--image", "i")
    assert rc == 2 and "d.yaml:2:1: error: unknown key 'bogus'" in err, err


def test_committed_example_is_current_and_valid():
    example = SOURCE_DIR / "packaging" / "k8s" / "train.k8s.yaml"
    rc, out, err = render(SOURCE_DIR / "packaging" / "k8s" / "train.yaml", *EXAMPLE_ARGS)
    assert rc == 0, err
    assert out == example.read_text(), "packaging/k8s/train.k8s.yaml is stale: rerun the command in train.yaml"
    by_kind = validate_all(out)
    limits = by_kind["Job"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8}
