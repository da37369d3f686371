#!/usr/bin/env node
// The contract's rules from Node: each request of a table is validated
// locally with @bufbuild/protovalidate against the buf.validate rules in the
// contract's descriptors (a FileDescriptorSet of proto/, e.g. from
// `buf build proto -o contract.binpb`); the verdict must equal the table's.
//
//   node contract-cases.js --cases ../contract/cases.json --descriptors contract.binpb
//
// A verdict is the set of field paths whose rules a request breaks ("" for a
// rule of the request message itself); empty means accepted. Prints one line
// per case; exits non-zero if any verdict differs.
'use strict';

const fs = require('fs');
const { createFileRegistry, fromBinary, fromJson } = require('@bufbuild/protobuf');
const { FileDescriptorSetSchema } = require('@bufbuild/protobuf/wkt');
const { pathToString } = require('@bufbuild/protobuf/reflect');
const { createValidator } = require('@bufbuild/protovalidate');

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) {
    console.error(`usage: contract-cases.js --cases FILE --descriptors FILE (missing ${name})`);
    process.exit(2);
  }
  return process.argv[i + 1];
}

function main() {
  const cases = JSON.parse(fs.readFileSync(arg('--cases'), 'utf8')).cases;
  const registry = createFileRegistry(
    fromBinary(FileDescriptorSetSchema, fs.readFileSync(arg('--descriptors'))),
  );
  const validator = createValidator({ registry });
  let failed = 0;
  for (const c of cases) {
    const [service, method] = c.rpc.split('/');
    const svc = registry.getService(service);
    const m = svc && svc.methods.find((x) => x.name === method);
    if (!m) throw new Error(`${c.rpc} is not in the descriptors`);
    const message = fromJson(m.input, c.request, { registry });
    const result = validator.validate(m.input, message);
    if (result.kind === 'error') throw result.error;
    const got = result.kind === 'valid'
      ? []
      : [...new Set(result.violations.map((v) => pathToString(v.field)))].sort();
    const want = [...new Set(c.refused)].sort();
    const same = JSON.stringify(got) === JSON.stringify(want);
    if (!same) failed += 1;
    const verdict = want.length ? `refused ${want.map((p) => JSON.stringify(p)).join(', ')}` : 'accepted';
    console.log(`${same ? 'ok' : 'FAILED'}: ${c.name}: ${verdict}${same ? ' (node agrees)' : ` (node got ${JSON.stringify(got)})`}`);
  }
  console.log(`contract cases from node: ${cases.length - failed} agree, ${failed} differ`);
  process.exit(failed ? 1 : 0);
}

main();
