// deploy/kubernetes against the Kubernetes API's schemas (kubernetes-models,
// offline), then what the schemas cannot see: the objects agree with each
// other, and the container's own command line starts this build's server,
// whose /healthz answers the probes.
// usage: node validate.mjs PATH/TO/pysbx SOURCE_DIR
import { readFileSync, readdirSync, writeFileSync, mkdtempSync, mkdirSync, chmodSync, rmSync } from "node:fs";
import { spawn } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import http from "node:http";
import { parseAllDocuments } from "yaml";
import { Deployment } from "kubernetes-models/apps/v1/Deployment";
import { Service } from "kubernetes-models/v1/Service";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1/PodDisruptionBudget";
import { Ingress } from "kubernetes-models/networking.k8s.io/v1/Ingress";

const [pysbx, src] = process.argv.slice(2);
const dir = join(src, "deploy", "kubernetes");
const models = {
  "apps/v1/Deployment": Deployment,
  "v1/Service": Service,
  "autoscaling/v2/HorizontalPodAutoscaler": HorizontalPodAutoscaler,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "networking.k8s.io/v1/Ingress": Ingress,
};
let failures = 0;
function check(name, ok, detail = "") {
  console.log((ok ? "ok   " : "FAIL ") + name + (ok ? "" : `: ${detail}`));
  if (!ok) failures++;
}

const objs = {};
for (const f of readdirSync(dir).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml")) {
  for (const doc of parseAllDocuments(readFileSync(join(dir, f), "utf8"))) {
    check(`${f} parses`, doc.errors.length === 0, doc.errors.join("; "));
    const o = doc.toJS();
    const key = `${o.apiVersion}/${o.kind}`;
    const Model = models[key];
    check(`${f}: ${key} is one of the expected kinds`, !!Model, key);
    if (!Model) continue;
    try {
      new Model(o).validate();
      check(`${f}: ${key} is valid against the Kubernetes schema`, true);
    } catch (e) {
      check(`${f}: ${key} is valid against the Kubernetes schema`, false, e.message);
    }
    objs[o.kind] = o;
  }
}
// The validator must refuse what is wrong, or the checks above mean nothing.
let refused = false;
try {
  const bad = structuredClone(objs.Deployment);
  bad.spec.template.spec.containers[0].ports[0].containerPort = "eighty";
  new Deployment(bad).validate();
} catch {
  refused = true;
}
check("the validator refuses a wrong type", refused);

const d = objs.Deployment, s = objs.Service, h = objs.HorizontalPodAutoscaler, p = objs.PodDisruptionBudget;
for (const k of ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"])
  check(`a ${k}`, !!objs[k]);
const labels = d.spec.template.metadata.labels;
const selects = (sel) => Object.entries(sel).every(([k, v]) => labels[k] === v);
check("the Deployment's selector matches its pods", selects(d.spec.selector.matchLabels));
check("the Service selects the pods", selects(s.spec.selector));
check("the PDB selects the pods", selects(p.spec.selector.matchLabels));
check("the HPA scales the Deployment", h.spec.scaleTargetRef.kind === "Deployment"
  && h.spec.scaleTargetRef.name === d.metadata.name);
check("the HPA scales on CPU", h.spec.metrics.some((m) => m.resource?.name === "cpu"));
check("the HPA's floor leaves the PDB satisfiable",
  h.spec.minReplicas > (p.spec.maxUnavailable ?? 0));
const c = d.spec.template.spec.containers[0];
const port = c.ports.find((x) => x.name === s.spec.ports[0].targetPort);
check("the Service's target port is the container's", !!port);
for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"])
  check(`${probe} is GET /healthz on the server's port`, c[probe]?.httpGet?.path === "/healthz"
    && (c[probe].httpGet.port === port?.name || c[probe].httpGet.port === port?.containerPort));
check("requests and limits for CPU and memory", c.resources?.requests?.cpu
  && c.resources?.requests?.memory && c.resources?.limits?.cpu && c.resources?.limits?.memory);
const sc = c.securityContext;
check("capabilities: all dropped, only what the layers need added",
  JSON.stringify(sc.capabilities.drop) === '["ALL"]'
  && JSON.stringify([...sc.capabilities.add].sort())
     === JSON.stringify(["DAC_OVERRIDE", "KILL", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN"]));
check("not privileged, read-only root", sc.privileged === false && sc.readOnlyRootFilesystem === true);
check("no service account token in the pod", d.spec.template.spec.automountServiceAccountToken === false);
const args = c.args;
const at = (opt) => args[args.indexOf(opt) + 1];
check("the server listens on the container's port", at("--http") === `0.0.0.0:${port?.containerPort}`);
// Sessions pinned: the ingress reaches the Service, and hashes on the
// variable that the controller's snippet defines with the very map that
// deploy/nginx/pysbx.conf has (which bench/lb.py --sessions runs).
const ing = objs.Ingress;
const backend = ing?.spec?.rules?.[0]?.http?.paths?.[0]?.backend?.service;
check("the Ingress sends to the Service's port", backend?.name === s.metadata.name
  && backend?.port?.name === s.spec.ports[0].name);
const mapOf = (text) => (text.match(/^map \$uri (\$\w+) \{\n[^]*?^\}$/m) || [])[0];
const snippet = mapOf(readFileSync(join(dir, "ingress-nginx-snippet.conf"), "utf8"));
const shipped = mapOf(readFileSync(join(src, "deploy", "nginx", "pysbx.conf"), "utf8"));
check("the controller's snippet has deploy/nginx/pysbx.conf's map", !!snippet && snippet === shipped,
  `${snippet} vs ${shipped}`);
check("the Ingress hashes on the map's variable",
  ing?.metadata?.annotations?.["nginx.ingress.kubernetes.io/upstream-hash-by"]
  === snippet?.match(/^map \$uri (\$\w+)/)?.[1]);
const tokenMount = c.volumeMounts.find((m) => at("--http-token-file").startsWith(m.mountPath + "/"));
const tokenVol = d.spec.template.spec.volumes.find((v) => v.name === tokenMount?.name);
check("the token file comes from a Secret", !!tokenVol?.secret?.secretName);
// The image names its Debian release, and the trixie overlay names the
// same image of the other release (scripts/image tags VERSION-RELEASE).
const overlay = parseAllDocuments(readFileSync(join(dir, "trixie", "kustomization.yaml"), "utf8"))[0].toJS();
const [imageName, imageTag] = c.image.split(/:(?=[^:]*$)/);
check("the image names Debian 12's release", imageTag?.endsWith("-bookworm"), c.image);
check("the trixie overlay names the same image of Debian 13",
  overlay.resources?.[0] === ".." && overlay.images?.[0]?.name === imageName
  && overlay.images[0].newTag === imageTag.replace(/-bookworm$/, "-trixie"),
  JSON.stringify(overlay));
const grace = Number(at("--grace"));
check("the pod's termination grace exceeds the server's drain grace",
  d.spec.template.spec.terminationGracePeriodSeconds > grace + 5);

// The container's command line, on loopback with a token of the test's own:
// it must start this build's server, and /healthz must answer 200.
const tmp = mkdtempSync(join(tmpdir(), "pysbx-kube-"));
writeFileSync(join(tmp, "token"), "test-token\n");
// The work root as the pod has it: an emptyDir (mode 0777).
chmodSync(tmp, 0o711);
mkdirSync(join(tmp, "work"));
chmodSync(join(tmp, "work"), 0o777);
const local = args.map((a, i) => args[i - 1] === "--http" ? "127.0.0.1:0"
  : args[i - 1] === "--http-token-file" ? join(tmp, "token") : a);
const server = spawn(pysbx, local, { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, TMPDIR: join(tmp, "work") } });
let stderr = "";
const started = await new Promise((resolve) => {
  const timer = setTimeout(() => resolve(null), 60000);
  server.stderr.on("data", (b) => {
    stderr += b;
    const m = stderr.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) { clearTimeout(timer); resolve(Number(m[1])); }
  });
  server.on("exit", () => { clearTimeout(timer); resolve(null); });
});
check("the container's command line starts the server", started !== null, stderr);
if (started) {
  let status = 0;
  for (let i = 0; i < 100 && status !== 200; i++) {
    status = await new Promise((resolve) => {
      http.get({ host: "127.0.0.1", port: started, path: c.readinessProbe.httpGet.path }, (r) => {
        r.resume();
        r.on("end", () => resolve(r.statusCode));
      }).on("error", () => resolve(0));
    });
    if (status !== 200) await new Promise((r) => setTimeout(r, 50));
  }
  check("the probes' path answers 200 without a token", status === 200, status);
  const code = await new Promise((resolve) => { server.on("exit", (c) => resolve(c)); server.kill("SIGTERM"); });
  check("SIGTERM: the server exits 0", code === 0, code);
}
rmSync(tmp, { recursive: true, force: true });
process.exit(failures ? 1 : 0);
