#!/usr/bin/env node
// A tiny Sluice client: loads Envoy's RLS v3 .proto files from the repository's protos/
// directory at run time (no generated code) and calls
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.
//
//   node index.js [--target HOST:PORT] '{"domain": "edge", "descriptors": [...]}'
//
// prints the response as JSON. Sluice's extras (the leaky-bucket delay, reasons) arrive in
// dynamic_metadata, a google.protobuf.Struct; they are printed as plain JSON under "sluice".
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// The repository's copy of Envoy's API; google/protobuf/*.proto (Duration, Struct, ...) are
// bundled with protobufjs, which @grpc/proto-loader resolves without any include directory.
const PROTOS_DIR = path.resolve(__dirname, '..', '..', '..', 'protos');
const RLS_PROTO = 'envoy/service/ratelimit/v3/rls.proto';

function loadService() {
  const definition = protoLoader.loadSync(RLS_PROTO, {
    includeDirs: [PROTOS_DIR],
    longs: Number, // durations and counters fit easily in a double
    enums: String, // "OK" / "OVER_LIMIT", "MINUTE", ...
    defaults: true, // every field present, as a decision should be read
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(definition);
  return pkg.envoy.service.ratelimit.v3.RateLimitService;
}

// google.protobuf.Struct / Value as plain JSON.
function fromValue(value) {
  switch (value.kind) {
    case 'nullValue': return null;
    case 'numberValue': return value.numberValue;
    case 'stringValue': return value.stringValue;
    case 'boolValue': return value.boolValue;
    case 'structValue': return fromStruct(value.structValue);
    case 'listValue': return (value.listValue.values || []).map(fromValue);
    default: return undefined;
  }
}

function fromStruct(struct) {
  const out = {};
  for (const [key, value] of Object.entries((struct && struct.fields) || {})) {
    out[key] = fromValue(value);
  }
  return out;
}

class SluiceClient {
  constructor(target, { credentials = grpc.credentials.createInsecure() } = {}) {
    const Service = loadService();
    this.client = new Service(target, credentials);
  }

  // Resolves to the RateLimitResponse plus `sluice` (dynamic_metadata as plain JSON).
  shouldRateLimit(request, { timeoutMs = 500 } = {}) {
    const deadline = new Date(Date.now() + timeoutMs);
    return new Promise((resolve, reject) => {
      this.client.ShouldRateLimit(request, { deadline }, (error, response) => {
        if (error) return reject(error);
        resolve({ ...response, sluice: fromStruct(response.dynamicMetadata) });
      });
    });
  }

  close() {
    this.client.close();
  }
}

async function main(argv) {
  let target = process.env.SLUICE_GRPC_TARGET || 'localhost:8081';
  const args = [...argv];
  const at = args.indexOf('--target');
  if (at !== -1) {
    target = args[at + 1];
    args.splice(at, 2);
  }
  if (args.length !== 1) {
    console.error("usage: node index.js [--target HOST:PORT] '<RateLimitRequest as JSON>'");
    return 2;
  }
  const client = new SluiceClient(target);
  try {
    const response = await client.shouldRateLimit(JSON.parse(args[0]));
    console.log(JSON.stringify(response));
    return response.overallCode === 'OVER_LIMIT' ? 1 : 0;
  } catch (error) {
    console.error(`ShouldRateLimit failed: ${error.message}`);
    return 3;
  } finally {
    client.close();
  }
}

module.exports = { SluiceClient, fromStruct, loadService };

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => { process.exitCode = code; });
}
