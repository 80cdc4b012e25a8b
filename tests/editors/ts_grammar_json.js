// Evaluate editors/tree-sitter-planlang/grammar.js with a small implementation of the tree-sitter grammar
// DSL and print the grammar as JSON, in the shape of the generator's src/grammar.json.
//
// tests/editors/test_tree_sitter.py compares the two, so a change to grammar.js that was not followed by
// `tree-sitter generate` (which rewrites src/) fails the tests. Only the DSL functions grammar.js uses
// (and their usual siblings) are implemented; an unknown one fails loudly.
//
// usage: node ts_grammar_json.js path/to/grammar.js
"use strict";

const path = require("path");

function normalize(value) {
  if (typeof value === "string") return { type: "STRING", value };
  if (value instanceof RegExp) {
    return value.flags ? { type: "PATTERN", value: value.source, flags: value.flags } : { type: "PATTERN", value: value.source };
  }
  if (value && typeof value === "object" && typeof value.type === "string") return value;
  throw new Error(`not a grammar rule: ${JSON.stringify(value)}`);
}

const dsl = {
  blank: () => ({ type: "BLANK" }),
  seq: (...members) => ({ type: "SEQ", members: members.map(normalize) }),
  choice: (...members) => ({ type: "CHOICE", members: members.map(normalize) }),
  optional: (rule) => ({ type: "CHOICE", members: [normalize(rule), { type: "BLANK" }] }),
  repeat: (rule) => ({ type: "REPEAT", content: normalize(rule) }),
  repeat1: (rule) => ({ type: "REPEAT1", content: normalize(rule) }),
  field: (name, rule) => ({ type: "FIELD", name, content: normalize(rule) }),
  alias: (rule, value) => {
    const content = normalize(rule);
    if (typeof value === "string") return { type: "ALIAS", content, named: false, value };
    if (value && value.type === "SYMBOL") return { type: "ALIAS", content, named: true, value: value.name };
    throw new Error(`alias target must be a string or a symbol: ${JSON.stringify(value)}`);
  },
};

function precedence(type) {
  return (value, rule) => (rule === undefined
    ? { type, value: 0, content: normalize(value) }
    : { type, value, content: normalize(rule) });
}
dsl.prec = (value, rule) => ({ type: "PREC", value, content: normalize(rule) });
dsl.prec.left = precedence("PREC_LEFT");
dsl.prec.right = precedence("PREC_RIGHT");
dsl.prec.dynamic = (value, rule) => ({ type: "PREC_DYNAMIC", value, content: normalize(rule) });
dsl.token = (rule) => ({ type: "TOKEN", content: normalize(rule) });
dsl.token.immediate = (rule) => ({ type: "IMMEDIATE_TOKEN", content: normalize(rule) });

// `$.name` in a rule: a symbol (any name, as in tree-sitter: unknown names are the generator's error)
const symbols = new Proxy({}, { get: (_target, name) => ({ type: "SYMBOL", name: String(name) }) });

dsl.grammar = (options) => {
  const rules = {};
  for (const [name, fn] of Object.entries(options.rules)) rules[name] = normalize(fn.call(null, symbols));
  const list = (key) => (options[key] ? options[key].call(null, symbols).map(normalize) : []);
  const names = (key) => (options[key] ? options[key].call(null, symbols).map((s) => s.name) : []);
  return {
    name: options.name,
    word: options.word ? options.word.call(null, symbols).name : undefined,
    rules,
    extras: options.extras ? list("extras") : [{ type: "PATTERN", value: "\\s" }],
    conflicts: options.conflicts ? options.conflicts.call(null, symbols).map((c) => c.map((s) => s.name)) : [],
    precedences: options.precedences ? options.precedences.call(null, symbols).map((p) => p.map(normalize)) : [],
    externals: list("externals"),
    inline: names("inline"),
    supertypes: names("supertypes"),
  };
};

Object.assign(globalThis, dsl);
const grammarPath = path.resolve(process.argv[2]);
const result = require(grammarPath);
process.stdout.write(JSON.stringify(result, null, 2) + "\n");
