// Runs against a live Sluice whose gRPC address is in SLUICE_GRPC_TARGET (skipped without
// one). SLUICE_TEST_DOMAIN and SLUICE_TEST_KEY name a rule with a small fixed limit; the
// defaults match tests/clients (domain "clients", key "user": 3 per hour).
'use strict';

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const path = require('node:path');
const { randomUUID } = require('node:crypto');
const { test } = require('node:test');

const { SluiceClient } = require('..');

const target = process.env.SLUICE_GRPC_TARGET;
const domain = process.env.SLUICE_TEST_DOMAIN || 'clients';
const key = process.env.SLUICE_TEST_KEY || 'user';
const skip = target ? false : 'SLUICE_GRPC_TARGET is not set';

function request(value) {
  return { domain, descriptors: [{ entries: [{ key, value }] }] };
}

test('allowed, then over the limit', { skip }, async () => {
  const client = new SluiceClient(target);
  try {
    const value = randomUUID();
    const first = await client.shouldRateLimit(request(value));
    assert.equal(first.overallCode, 'OK');
    const [status] = first.statuses;
    const limit = status.currentLimit.requestsPerUnit;
    assert.ok(limit >= 1 && limit <= 100, `a small limit is needed, got ${limit}`);
    assert.equal(status.limitRemaining, limit - 1);
    assert.ok(status.durationUntilReset.seconds >= 0);

    let last = first;
    for (let i = 1; i <= limit; i += 1) last = await client.shouldRateLimit(request(value));
    assert.equal(last.overallCode, 'OVER_LIMIT');
    assert.equal(last.statuses[0].code, 'OVER_LIMIT');
    assert.equal(last.statuses[0].limitRemaining, 0);
  } finally {
    client.close();
  }
});

test('an invalid request is refused with INVALID_ARGUMENT', { skip }, async () => {
  const client = new SluiceClient(target);
  try {
    await assert.rejects(client.shouldRateLimit({ domain, descriptors: [] }), (error) => {
      assert.equal(error.code, 3); // grpc.status.INVALID_ARGUMENT
      return true;
    });
  } finally {
    client.close();
  }
});

test('the command line prints the response as JSON', { skip }, async () => {
  const script = path.join(__dirname, '..', 'index.js');
  const stdout = await new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [script, '--target', target, JSON.stringify(request(randomUUID()))],
      (error, out, err) => (error ? reject(new Error(`${error.message}\n${err}`)) : resolve(out)),
    );
  });
  const response = JSON.parse(stdout);
  assert.equal(response.overallCode, 'OK');
  assert.equal(response.statuses.length, 1);
  assert.deepEqual(response.sluice, {});
});
