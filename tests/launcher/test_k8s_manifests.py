"""tools/k8s: the JobSet and MXJob manifests and the Dockerfile, validated without a cluster.

Parses the YAML and checks roles, counts and the DMLC_* environment each pod gets (for the
MXJob, the environment the operator injects is simulated from its documented rules), field
names against the API's known fields (to catch typos a cluster would reject or silently
drop), and that the image built by the Dockerfile has the commands the manifests run.
Nothing here talks to a cluster; tools/k8s/README.md says what was and was not run.
"""
import os
import re
import unittest

from launcher_testlib import REPO

try:
    import yaml
except ImportError:  # python3-yaml, installed by tools/install-deps.sh
    yaml = None

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
            else:
                env[var["name"]] = ("fieldRef", var["valueFrom"]["fieldRef"]["fieldPath"])
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
            self.assertEqual(job["backoffLimit"], 0)
            per_job = job.get("parallelism", 1)
            self.assertEqual(job.get("completions", 1), per_job)
            pod_tpl = job["template"]
            container = self.check_pod(pod_tpl["spec"], f"{name} pod")
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
