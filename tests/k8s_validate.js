// Validates Kubernetes manifests offline against the Kubernetes API schema.
//
//   NODE_PATH=$(npm root -g) node tests/k8s_validate.js [--json OUT] FILE.yaml...
//
// Every YAML document is checked with the kubernetes-models package (JSON schema of the
// Kubernetes API: types, required fields, enums), and strictly: a field the schema does not
// know is an error, as with `kubectl apply --validate=strict` (kubernetes-models alone accepts
// unknown fields, so a misspelled `readinesProbe` would pass). A Kubeflow TFJob, a custom
// resource that kubernetes-models has no schema for, is checked against the TFJob v1 API
// structure below, and each replica's pod template against the Kubernetes schema.
//
// Prints "ok FILE KIND/NAME" or "invalid FILE KIND/NAME: reasons" per document and exits 1 if any
// is invalid. --json OUT writes every parsed document as a JSON array (for checks in Python).
"use strict";

const fs = require("fs");
const YAML = require("yaml");

const MODELS = {
  "v1/ConfigMap": require("kubernetes-models/v1/ConfigMap").ConfigMap,
  "v1/Service": require("kubernetes-models/v1/Service").Service,
  "apps/v1/StatefulSet": require("kubernetes-models/apps/v1/StatefulSet").StatefulSet,
  "batch/v1/Job": require("kubernetes-models/batch/v1/Job").Job,
};
const { PodTemplateSpec } = require("kubernetes-models/v1/PodTemplateSpec");

// Wraps data in proxies that record which fields the schema's validator reads. A field of an
// object that was never read, in an object whose keys were never listed (a map such as labels
// is listed), is unknown to the schema.
function track(value, path, records) {
  if (value === null || typeof value !== "object") return value;
  const record = { path, value, read: new Set(), listed: false };
  records.push(record);
  const copy = Array.isArray(value)
    ? value.map((v, i) => track(v, `${path}/${i}`, records))
    : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, track(v, `${path}/${k}`, records)]));
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.has(target, key);
    },
    ownKeys(target) {
      record.listed = true;
      return Reflect.ownKeys(target);
    },
  });
}

function unknownFields(records) {
  const unknown = [];
  for (const r of records) {
    if (Array.isArray(r.value) || r.listed) continue;
    for (const key of Object.keys(r.value)) {
      const path = `${r.path}/${key}`;
      // Report the outermost unknown field only.
      if (!r.read.has(key) && !unknown.some((u) => path.startsWith(u + "/"))) unknown.push(path);
    }
  }
  return unknown.map((p) => `${p || "/"}: unknown field`);
}

function schemaErrors(err) {
  const details = err && err.errors;
  if (Array.isArray(details)) return details.map((e) => `${e.instancePath || "/"} ${e.message}`);
  return [String(err && err.message ? err.message : err)];
}

// Validates data with a kubernetes-models class; prefix is the path of data in the document.
// The model's validate() runs on the tracking proxy itself (the constructor would copy the data
// and read every field). Unknown fields are reported once the schema is satisfied: after a
// schema error the validator may not have looked at everything.
function validateModel(Model, data, prefix) {
  const records = [];
  try {
    Model.prototype.validate.call(track(data, prefix, records));
  } catch (err) {
    return schemaErrors(err).map((e) => (e.startsWith("/") ? prefix + e : e));
  }
  return unknownFields(records);
}

// Kubeflow training operator, kubeflow.org/v1 TFJob: the fields of its API types.
const TFJOB_SPEC = ["runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"];
const RUN_POLICY = ["cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
  "schedulingPolicy", "suspend", "managedBy"];
const REPLICA_TYPES = ["Chief", "Master", "PS", "Worker", "Evaluator"];
const REPLICA_SPEC = ["replicas", "template", "restartPolicy"];
const RESTART_POLICIES = ["Always", "OnFailure", "Never", "ExitCode"];
const CLEAN_POD_POLICIES = ["All", "Running", "None"];

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function validateTFJob(doc) {
  const errors = [];
  const onlyKnown = (obj, known, path) => {
    for (const key of Object.keys(obj)) if (!known.includes(key)) errors.push(`${path}/${key}: unknown field`);
  };
  onlyKnown(doc, ["apiVersion", "kind", "metadata", "spec", "status"], "");
  if (!isObject(doc.metadata) || typeof doc.metadata.name !== "string") errors.push("/metadata/name: required");
  else errors.push(...validateModel(PodTemplateSpec, { metadata: doc.metadata }, ""));
  const spec = doc.spec;
  if (!isObject(spec)) return errors.concat(["/spec: must be an object"]);
  onlyKnown(spec, TFJOB_SPEC, "/spec");
  if (spec.runPolicy !== undefined) {
    if (!isObject(spec.runPolicy)) errors.push("/spec/runPolicy: must be an object");
    else {
      onlyKnown(spec.runPolicy, RUN_POLICY, "/spec/runPolicy");
      const clean = spec.runPolicy.cleanPodPolicy;
      if (clean !== undefined && !CLEAN_POD_POLICIES.includes(clean)) {
        errors.push(`/spec/runPolicy/cleanPodPolicy must be one of ${CLEAN_POD_POLICIES.join(", ")}`);
      }
    }
  }
  const replicas = spec.tfReplicaSpecs;
  if (!isObject(replicas) || Object.keys(replicas).length === 0) {
    return errors.concat(["/spec/tfReplicaSpecs: required, a map of replica type to replica spec"]);
  }
  for (const [type, r] of Object.entries(replicas)) {
    const path = `/spec/tfReplicaSpecs/${type}`;
    if (!REPLICA_TYPES.includes(type)) errors.push(`${path}: replica type must be one of ${REPLICA_TYPES.join(", ")}`);
    if (!isObject(r)) {
      errors.push(`${path}: must be an object`);
      continue;
    }
    onlyKnown(r, REPLICA_SPEC, path);
    if (r.replicas !== undefined && !(Number.isInteger(r.replicas) && r.replicas >= 0)) {
      errors.push(`${path}/replicas must be a non-negative integer`);
    }
    if (r.restartPolicy !== undefined && !RESTART_POLICIES.includes(r.restartPolicy)) {
      errors.push(`${path}/restartPolicy must be one of ${RESTART_POLICIES.join(", ")}`);
    }
    if (!isObject(r.template)) {
      errors.push(`${path}/template: required`);
      continue;
    }
    errors.push(...validateModel(PodTemplateSpec, r.template, `${path}/template`));
    const containers = (r.template.spec && r.template.spec.containers) || [];
    // The operator finds its container by this name (and the port named tfjob-port in it).
    if (!containers.some((c) => c && c.name === "tensorflow")) {
      errors.push(`${path}/template/spec/containers: needs a container named "tensorflow"`);
    }
  }
  return errors;
}

function validate(doc) {
  if (!isObject(doc)) return ["a manifest must be a mapping"];
  const key = `${doc.apiVersion}/${doc.kind}`;
  if (key === "kubeflow.org/v1/TFJob") return validateTFJob(doc);
  const Model = MODELS[key];
  if (!Model) return [`unsupported apiVersion/kind ${key}`];
  return validateModel(Model, doc, "");
}

function main(argv) {
  let jsonOut = null;
  const files = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--json") jsonOut = argv[++i];
    else files.push(argv[i]);
  }
  if (files.length === 0) {
    console.error("usage: node k8s_validate.js [--json OUT] FILE.yaml...");
    return 2;
  }
  let bad = 0;
  const all = [];
  for (const file of files) {
    const parsed = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
    for (const d of parsed) {
      const label = () => `${file} ${(d.toJS() || {}).kind}/${((d.toJS() || {}).metadata || {}).name}`;
      if (d.errors.length > 0) {
        bad++;
        console.log(`invalid ${file}: YAML: ${d.errors.map((e) => e.message).join("; ")}`);
        continue;
      }
      const doc = d.toJS();
      if (doc === null || doc === undefined) continue; // an empty document (comments only)
      all.push({ file, doc });
      const errors = validate(doc);
      if (errors.length > 0) {
        bad++;
        console.log(`invalid ${label()}: ${errors.join("; ")}`);
      } else {
        console.log(`ok ${label()}`);
      }
    }
  }
  if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify(all, null, 1));
  return bad > 0 ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
