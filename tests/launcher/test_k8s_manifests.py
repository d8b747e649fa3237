"""tools/k8s: the JobSet and MXJob manifests and the Dockerfile, validated without a cluster.

Parses the YAML and checks roles, counts and the DMLC_* environment each pod gets (for the
MXJob, the environment the operator injects is simulated from its documented rules), field
names against the API's known fields (to catch typos a cluster would reject or silently
drop), and that the image built by the Dockerfile has the commands the manifests run.
Every built-in Kubernetes object in the manifests (the Service, the Jobs a JobSet makes, the
pod templates an MXJob holds) is validated against the Kubernetes API's JSON schema, strictly
(unknown fields and wrong types fail), with kubernetes-validate (PyPI), which ships the schemas:
tools/install-deps.sh installs it into PS_PYTHON_DIR, and the check runs offline.
Nothing here talks to a cluster; tools/k8s/README.md says what was and was not run.
"""
import copy
import os
import re
import sys
import unittest

from launcher_testlib import REPO

try:
    import yaml
except ImportError:  # python3-yaml, installed by tools/install-deps.sh
    yaml = None

# kubernetes-validate, where tools/install-deps.sh puts it (pip --target, per Python version).
PS_PYTHON_DIR = os.environ.get("PS_PYTHON_DIR", "/usr/local/lib/ps-python")
_validator_dir = os.path.join(PS_PYTHON_DIR, "python%d.%d" % sys.version_info[:2])
if os.path.isdir(_validator_dir) and _validator_dir not in sys.path:
    sys.path.insert(0, _validator_dir)  # its own dependencies (jsonschema) first
try:
    import kubernetes_validate
except ImportError:
    kubernetes_validate = None
# The Kubernetes version whose API the manifests are checked against (JobSet needs 1.27+).
KUBERNETES_VERSION = "1.30"

K8S = os.path.join(REPO, "tools", "k8s")
CONTRACT = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
            "DMLC_NUM_WORKER", "DMLC_NODE_HOST")
MXJOB_INJECTED = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
                  "DMLC_ROLE", "DMLC_USE_KUBERNETES")
ROLE_COMMAND = {"scheduler": "ps-scheduler", "server": "ps-server", "worker": "ps-train"}

# Known fields (jobset.x-k8s.io/v1alpha2, batch/v1, core/v1), enough for these manifests.
JOBSET_SPEC = {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy",
               "suspend", "coordinator", "managedBy", "ttlSecondsAfterFinished"}
REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}
NETWORK = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
SUCCESS_POLICY = {"operator", "targetReplicatedJobs"}
FAILURE_POLICY = {"maxRestarts", "restartStrategy", "rules"}
JOB_SPEC = {"parallelism", "completions", "backoffLimit", "template", "completionMode",
            "activeDeadlineSeconds", "ttlSecondsAfterFinished", "podFailurePolicy",
            "backoffLimitPerIndex", "maxFailedIndexes", "suspend", "selector", "manualSelector",
            "podReplacementPolicy", "successPolicy"}
POD_SPEC = {"containers", "restartPolicy", "initContainers", "volumes", "nodeSelector",
            "affinity", "tolerations", "serviceAccountName", "hostNetwork", "subdomain",
            "hostname", "securityContext", "imagePullSecrets", "priorityClassName",
            "terminationGracePeriodSeconds", "dnsPolicy", "schedulerName"}
CONTAINER = {"name", "image", "command", "args", "env", "envFrom", "ports", "resources",
             "volumeMounts", "workingDir", "imagePullPolicy", "securityContext",
             "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"}
MXJOB_SPEC = {"jobMode", "mxReplicaSpecs", "runPolicy"}
MX_REPLICA = {"replicas", "template", "restartPolicy", "label"}
RUN_POLICY = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
              "backoffLimit", "schedulingPolicy", "suspend", "managedBy"}


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


@unittest.skipIf(yaml is None, "python3-yaml not installed (tools/install-deps.sh installs it)")
class Manifests(unittest.TestCase):

    def assert_fields(self, obj, allowed, where):
        unknown = set(obj) - allowed
        self.assertFalse(unknown, f"{where}: unknown field(s) {sorted(unknown)}")

    def check_pod(self, pod_spec, where, restart_policy="Never"):
        self.assert_fields(pod_spec, POD_SPEC, where)
        self.assertEqual(pod_spec.get("restartPolicy"), restart_policy, where)
        container, = pod_spec["containers"]
        self.assert_fields(container, CONTAINER, where + ".containers[0]")
        for var in container.get("env", []):
            self.assertIn("name", var, where)
            self.assertEqual(len(set(var) & {"value", "valueFrom"}), 1,
                             f"{where}: env {var} needs exactly one of value/valueFrom")
            self.assertFalse(set(var) - {"name", "value", "valueFrom"}, where)
            if "value" in var:
                self.assertIsInstance(var["value"], str, f"{where}: {var['name']} must be a "
                                                         "string (quote numbers)")
        return container

    @staticmethod
    def env_of(container):
        env = {}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            elif "fieldRef" in var["valueFrom"]:
                env[var["name"]] = ("fieldRef", var["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                env[var["name"]] = ("secretKeyRef", ref["name"], ref["key"])
        return env

    # ---- JobSet
    def jobset(self):
        docs = load("jobset.yaml")
        kinds = {d["kind"]: d for d in docs}
        self.assertEqual(sorted(kinds), ["JobSet", "Service"])
        return kinds["Service"], kinds["JobSet"]

    def test_jobset_roles_counts_and_env(self):
        service, js = self.jobset()
        self.assertEqual(js["apiVersion"], "jobset.x-k8s.io/v1alpha2")
        spec = js["spec"]
        self.assert_fields(spec, JOBSET_SPEC, "JobSet.spec")
        self.assert_fields(spec.get("network", {}), NETWORK, "JobSet.spec.network")
        self.assert_fields(spec["successPolicy"], SUCCESS_POLICY, "successPolicy")
        self.assertEqual(spec["successPolicy"]["operator"], "All")
        self.assertFalse(spec["successPolicy"].get("targetReplicatedJobs"))
        self.assert_fields(spec["failurePolicy"], FAILURE_POLICY, "failurePolicy")
        self.assertEqual(spec["failurePolicy"]["maxRestarts"], 0)

        rjobs = {r["name"]: r for r in spec["replicatedJobs"]}
        self.assertEqual(list(rjobs), ["scheduler", "server", "worker"])
        pods = {}
        seen = []
        for name, rj in rjobs.items():
            self.assert_fields(rj, REPLICATED_JOB, f"replicatedJobs[{name}]")
            for dep in rj.get("dependsOn", []):  # only earlier ones; one item at most
                self.assertIn(dep["name"], seen)
                self.assertIn(dep["status"], ("Ready", "Complete"))
            self.assertLessEqual(len(rj.get("dependsOn", [])), 1)
            seen.append(name)
            job = rj["template"]["spec"]
            self.assert_fields(job, JOB_SPEC, f"replicatedJobs[{name}].template.spec")
            # A server's process that dies is restarted in its pod and takes its rank again
            # (replication); any other failure ends the job.
            self.assertEqual(job["backoffLimit"], 3 if name == "server" else 0)
            per_job = job.get("parallelism", 1)
            self.assertEqual(job.get("completions", 1), per_job)
            pod_tpl = job["template"]
            container = self.check_pod(pod_tpl["spec"], f"{name} pod",
                                       "OnFailure" if name == "server" else "Never")
            pods[name] = (rj["replicas"] * per_job, pod_tpl["metadata"]["labels"], container)

        count = {role: n for role, (n, _, _) in pods.items()}
        self.assertEqual(count["scheduler"], 1)
        images = {c["image"] for _, _, c in pods.values()}
        self.assertEqual(len(images), 1, images)

        # headless Service -> the scheduler pod; its name is DMLC_PS_ROOT_URI
        self.assertEqual(service["spec"]["clusterIP"], "None")
        selector = service["spec"]["selector"]
        for role, (_, labels, _) in pods.items():
            matches = all(labels.get(k) == v for k, v in selector.items())
            self.assertEqual(matches, role == "scheduler", f"Service selector vs {role} pods")
        svc_port = service["spec"]["ports"][0]
        sched_ports = [p["containerPort"] for p in pods["scheduler"][2]["ports"]]
        self.assertIn(svc_port["targetPort"], sched_ports)

        for role, (_, _, container) in pods.items():
            env = self.env_of(container)
            for var in CONTRACT:
                self.assertIn(var, env, f"{role}: {var} missing")
            self.assertEqual(env["DMLC_ROLE"], role)
            self.assertEqual(env["DMLC_PS_ROOT_URI"], service["metadata"]["name"])
            self.assertEqual(env["DMLC_PS_ROOT_PORT"], str(svc_port["port"]))
            self.assertEqual(env["DMLC_NUM_SERVER"], str(count["server"]))
            self.assertEqual(env["DMLC_NUM_WORKER"], str(count["worker"]))
            self.assertEqual(env["DMLC_NODE_HOST"], ("fieldRef", "status.podIP"))
            self.assertEqual(env["PS_JOB_SECRET"], ("secretKeyRef", "ps-job-secret", "secret"))
            self.assertEqual(container["command"][0], ROLE_COMMAND[role])

    # ---- MXJob
    def test_mxjob_roles_counts_and_injected_env(self):
        mx, = load("mxjob.yaml")
        self.assertEqual((mx["apiVersion"], mx["kind"]), ("kubeflow.org/v1", "MXJob"))
        spec = mx["spec"]
        self.assert_fields(spec, MXJOB_SPEC, "MXJob.spec")
        self.assert_fields(spec.get("runPolicy", {}), RUN_POLICY, "MXJob.spec.runPolicy")
        self.assertEqual(spec["jobMode"], "MXTrain")
        replicas = spec["mxReplicaSpecs"]
        self.assertEqual(sorted(replicas), ["Scheduler", "Server", "Worker"])
        self.assertEqual(replicas["Scheduler"]["replicas"], 1)
        ports = set()
        for rtype, rs in replicas.items():
            self.assert_fields(rs, MX_REPLICA, f"mxReplicaSpecs.{rtype}")
            # set per replica (the operator overrides the pod's); a failed node ends the job
            self.assertEqual(rs["restartPolicy"], "Never")
            container = self.check_pod(rs["template"]["spec"], rtype, restart_policy=None)
            self.assertEqual(container["name"], "mxnet")  # the operator looks for this name
            port = [p["containerPort"] for p in container["ports"] if p["name"] == "mxjob-port"]
            self.assertEqual(len(port), 1, f"{rtype}: a port named mxjob-port")
            ports.add(port[0])
            env = self.env_of(container)
            for var in MXJOB_INJECTED:
                self.assertNotIn(var, env, f"{rtype}: {var} is injected by the operator")
            self.assertEqual(env["DMLC_NODE_HOST"], ("fieldRef", "status.podIP"))
            self.assertEqual(env["PS_JOB_SECRET"], ("secretKeyRef", "ps-job-secret", "secret"))
            role = rtype.lower()
            self.assertEqual(container["command"][0], ROLE_COMMAND[role])
            # what the pod ends up with, per the operator's rules (kubeflow training-operator,
            # pkg/controller.v1/mxnet: root URI = the scheduler replica's service name)
            injected = {
                "DMLC_PS_ROOT_URI": f"{mx['metadata']['name']}-scheduler-0",
                "DMLC_PS_ROOT_PORT": str(port[0]),
                "DMLC_NUM_SERVER": str(replicas["Server"]["replicas"]),
                "DMLC_NUM_WORKER": str(replicas["Worker"]["replicas"]),
                "DMLC_ROLE": role,
                "DMLC_USE_KUBERNETES": "1",
            }
            full = dict(env, **injected)
            for var in CONTRACT:
                self.assertIn(var, full)
        self.assertEqual(len(ports), 1)

    def test_jobset_and_mxjob_describe_the_same_job(self):
        _, js = self.jobset()
        mx, = load("mxjob.yaml")
        rjobs = {r["name"]: r for r in js["spec"]["replicatedJobs"]}
        for role in ("scheduler", "server", "worker"):
            rj = rjobs[role]
            js_count = rj["replicas"] * rj["template"]["spec"].get("parallelism", 1)
            mx_rs = mx["spec"]["mxReplicaSpecs"][role.capitalize()]
            self.assertEqual(js_count, mx_rs["replicas"], role)
            js_c = rj["template"]["spec"]["template"]["spec"]["containers"][0]
            mx_c = mx_rs["template"]["spec"]["containers"][0]
            self.assertEqual(js_c["command"], mx_c["command"], role)
            self.assertEqual(js_c["image"], mx_c["image"], role)

    # ---- Dockerfile and README
    def test_dockerfile_builds_what_the_manifests_run(self):
        with open(os.path.join(K8S, "Dockerfile")) as f:
            text = f.read()
        self.assertRegex(text, r"(?m)^FROM debian:12|^ARG DEBIAN=debian:12")
        self.assertIn("tools/install-deps.sh", text)
        for step in ("cmake -S", "cmake --build", "cmake --install"):
            self.assertIn(step, text)
        self.assertRegex(text, r"ENV PATH=/opt/ps/bin")
        checked = re.search(r"for b in ([^;]*); do", text).group(1).split()
        commands = {c["command"][0] for d in load("jobset.yaml") + load("mxjob.yaml")
                    for c in containers(d)}
        self.assertEqual(commands, {"ps-scheduler", "ps-server", "ps-train"})
        self.assertLessEqual(commands, set(checked))
        with open(os.path.join(K8S, "Dockerfile.dockerignore")) as f:
            self.assertIn("build", f.read().split())

    def test_readme_says_what_was_run(self):
        with open(os.path.join(K8S, "README.md")) as f:
            text = f.read()
        self.assertIn("not been run on a real Kubernetes cluster", text)
        # Kubeflow's training operator 1.9 dropped MXJob: the README sends users to the JobSet.
        words = " ".join(text.split())
        self.assertIn("deprecated MXJob in release 1.8 and removed it in 1.9", words)
        self.assertIn("Use the JobSet", words)


def builtin_objects(doc):
    """(where, object) for every built-in Kubernetes object a manifest document makes: the
    document itself when it is one, each replicated Job of a JobSet (as the batch/v1 Job the
    controller creates from its template), each pod template of an MXJob (as a core/v1
    PodTemplate)."""
    if doc["kind"] == "JobSet":
        for rj in doc["spec"]["replicatedJobs"]:
            job = {"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": dict(rj["template"].get("metadata", {}), name=rj["name"]),
                   "spec": rj["template"]["spec"]}
            yield f"JobSet replicatedJobs[{rj['name']}]", job
    elif doc["kind"] == "MXJob":
        for rtype, rs in doc["spec"]["mxReplicaSpecs"].items():
            template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": rtype.lower()}, "template": rs["template"]}
            yield f"MXJob mxReplicaSpecs.{rtype}.template", template
    else:
        yield f"{doc['kind']} {doc['metadata']['name']}", doc


@unittest.skipIf(yaml is None, "python3-yaml not installed (tools/install-deps.sh installs it)")
@unittest.skipIf(kubernetes_validate is None,
                 f"kubernetes-validate not found in {_validator_dir} (tools/install-deps.sh "
                 "installs it there with pip)")
class Schemas(unittest.TestCase):
    """The manifests' built-in objects against the Kubernetes API's JSON schemas, strictly."""

    def validate(self, where, obj):
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            self.fail(f"{where}: {path}: {e.message}")

    def test_every_builtin_object_is_valid(self):
        checked = []
        for name in ("jobset.yaml", "mxjob.yaml"):
            for doc in load(name):
                for where, obj in builtin_objects(doc):
                    with self.subTest(where=where):
                        self.validate(f"{name}: {where}", obj)
                    checked.append(obj["kind"])
        # The Service, the three Jobs of the JobSet, the three pod templates of the MXJob.
        self.assertEqual(sorted(checked), ["Job"] * 3 + ["PodTemplate"] * 3 + ["Service"])

    def test_the_validator_catches_typos_and_wrong_types(self):
        # So that a pass above means something: the mistakes a hand-written manifest makes.
        _, job = next(builtin_objects(load("jobset.yaml")[1]))
        for mistake in ("typo", "type", "missing"):
            bad = copy.deepcopy(job)
            pod = bad["spec"]["template"]["spec"]
            if mistake == "typo":
                pod["containers"][0]["comand"] = pod["containers"][0].pop("command")
            elif mistake == "type":
                bad["spec"]["backoffLimit"] = "0"
            else:
                del pod["containers"][0]["name"]
            with self.subTest(mistake=mistake):
                with self.assertRaises(kubernetes_validate.ValidationError):
                    kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def containers(doc):
    """Every container in a JobSet or MXJob document."""
    if doc["kind"] == "JobSet":
        for rj in doc["spec"]["replicatedJobs"]:
            yield from rj["template"]["spec"]["template"]["spec"]["containers"]
    elif doc["kind"] == "MXJob":
        for rs in doc["spec"]["mxReplicaSpecs"].values():
            yield from rs["template"]["spec"]["containers"]


if __name__ == "__main__":
    unittest.main()
