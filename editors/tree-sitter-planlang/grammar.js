/**
 * @file Tree-sitter grammar for planlang (.plan files), a declarative language for distributed-training plans.
 * @license Apache-2.0
 *
 * Written from grammar/planlang.lark (the one source of truth for the syntax) and docs/language.md:
 * the rule structure follows the Lark grammar rule for rule, so the trees are the parser's trees with
 * readable node names. tests/editors/test_tree_sitter.py checks the two against each other (keywords, soft
 * keywords, where keywords are keywords, and that every plan of the repository parses without errors).
 *
 * Layout (planlang.lang.parser.PlanPostLex in the real parser):
 *   - a statement, and an item of a `{ }` block, ends at a line break or `;`;
 *   - line breaks inside `( )` and `[ ]` are ignored. Tree-sitter lexes a line break as the `_newline`
 *     token only where the parse state accepts one (the end of a statement or block item); everywhere
 *     else, inside brackets included, it is whitespace (an extra);
 *   - `\` at the end of a line joins the next line (an extra).
 *
 * Keywords are soft: every keyword is also a name wherever a name may stand (`attention.output.dense`,
 * `for x in ...`). A keyword used as a name is an `identifier` node (an alias); only a keyword in keyword
 * position is an anonymous `"output"` node, so highlight queries that capture `"output"` mark exactly the
 * keywords the real parser reads as keywords.
 */

// grammar/planlang.lark's `!name` rule: the keywords that are also names.
const SOFT_KEYWORDS = [
  'output', 'input', 'model', 'data', 'stage', 'mesh', 'device', 'link', 'budget',
  'optimizer', 'pipeline', 'checkpoint', 'template', 'use', 'as', 'of', 'over', 'per',
  'schedule', 'microbatches', 'chunks', 'every', 'with', 'partial', 'to', 'in', 'shard',
  'apply', 'for', 'x',
];

/** `rule ("," rule)* ","?`, possibly empty (Lark: `[rule ("," rule)* ","?]`). */
function commaSep(rule) {
  return optional(commaSep1(rule));
}

/** `rule ("," rule)* ","?` */
function commaSep1(rule) {
  return seq(rule, repeat(seq(',', rule)), optional(','));
}

/** `rule ("," rule)*`, no trailing comma (stage and checkpoint paths, stage degrees). */
function commaList1(rule) {
  return seq(rule, repeat(seq(',', rule)));
}

module.exports = grammar({
  name: 'planlang',

  word: $ => $.identifier,

  extras: $ => [
    $.comment,
    /\s/,
    /\\[ \t]*\r?\n/, // line continuation
  ],

  supertypes: $ => [
    $._statement,
    $._value,
  ],

  rules: {
    // start: _nl? (_item _term)* _item?
    source_file: $ => seq(
      optional($._terminators),
      repeat(seq($._statement, $._terminators)),
      optional($._statement),
    ),

    // _term: _NL | ";" _nl?  (this also takes `;;` and `;` on a line of its own, which Lark rejects)
    _terminators: $ => repeat1(choice($._newline, ';')),

    _newline: _ => '\n',

    _statement: $ => choice(
      $.use_statement,
      $.model_declaration,
      $.input_declaration,
      $.device_declaration,
      $.link_declaration,
      $.mesh_declaration,
      $.mesh_alias,
      $.budget_statement,
      $.optimizer_declaration,
      $.data_statement,
      $.pipeline_declaration,
      $.template_declaration,
      $.shard_statement,
      $.checkpoint_statement,
      $.apply_statement,
      $.for_statement,
    ),

    // statements allowed at top level, inside `for` and inside `template` bodies
    _body_statement: $ => choice(
      $.shard_statement,
      $.checkpoint_statement,
      $.apply_statement,
      $.for_statement,
    ),

    // ------------------------------------------------------------------ use
    use_statement: $ => seq(
      'use',
      field('module', choice($.dotted_name, $.string)),
      optional(seq('as', field('alias', $._name))),
    ),

    // ------------------------------------------------------------------ model and inputs
    model_declaration: $ => seq(
      'model',
      field('name', $._name),
      '=',
      field('factory', $.string),
      optional(field('arguments', $.arguments)),
    ),

    arguments: $ => seq('(', commaSep($.keyword_argument), ')'),

    keyword_argument: $ => seq(field('name', $._name), '=', field('value', $._value)),

    input_declaration: $ => seq(
      'input',
      field('name', $._name),
      ':',
      field('dtype', $._name),
      field('dimensions', $.dimensions),
    ),

    dimensions: $ => seq('[', commaSep($.dimension), ']'),

    dimension: $ => seq(field('name', $._name), '=', field('size', $.integer)),

    // ------------------------------------------------------------------ hardware
    device_declaration: $ => seq('device', field('name', $._name), field('body', $.field_block)),

    link_declaration: $ => seq('link', field('name', $._name), field('body', $.field_block)),

    field_block: $ => seq('{', lines($, $.field), '}'),

    field: $ => seq(
      field('key', alias($.dotted_name, $.field_name)),
      '=',
      field('value', $._value),
      optional(seq('over', field('axis', $._axis_or_hole))),
    ),

    // ------------------------------------------------------------------ mesh
    mesh_declaration: $ => seq(
      'mesh',
      field('name', $._name),
      'of',
      optional(seq(field('count', $.integer), 'x')),
      field('device', $.dotted_name),
      field('body', $.axis_block),
    ),

    mesh_alias: $ => seq('mesh', field('name', $._name), '=', field('preset', $.dotted_name)),

    axis_block: $ => seq('{', lines($, $.axis_declaration), '}'),

    axis_declaration: $ => seq(
      field('name', $._name),
      '=',
      field('size', $._int_or_hole),
      optional(seq('over', field('link', $.dotted_name))),
    ),

    // ------------------------------------------------------------------ budget, optimizer, data
    budget_statement: $ => seq('budget', field('value', $._value), optional($.per_device)),

    per_device: _ => seq('per', 'device'),

    optimizer_declaration: $ => seq(
      'optimizer',
      field('name', $._name),
      optional(field('arguments', $.arguments)),
      optional(field('body', $.field_block)),
    ),

    data_statement: $ => seq('data', field('input', $._name), ':', field('spec', $._spec_or_hole)),

    // ------------------------------------------------------------------ sharding specs
    shard_statement: $ => seq(
      'shard',
      field('target', choice($.path, $.activation)),
      ':',
      field('spec', $._spec_or_hole),
    ),

    activation: $ => seq(field('kind', choice('output', 'input')), 'of', field('module', $.path)),

    _spec_or_hole: $ => choice($.spec, $.hole),

    spec: $ => seq(
      '[',
      commaSep(choice($._name, $.axis_tuple, $.replicated, $.hole)),
      ']',
      optional(field('partial', $.partial)),
    ),

    axis_tuple: $ => seq('(', commaSep1($._name), ')'),

    replicated: _ => '_',

    partial: $ => seq('partial', '(', commaSep1($._name), ')'),

    // ------------------------------------------------------------------ pipeline
    pipeline_declaration: $ => seq(
      'pipeline',
      'over',
      field('axis', $._axis_or_hole),
      'schedule',
      field('schedule', $.schedule),
      'microbatches',
      field('microbatches', $._int_or_hole),
      field('body', $.stage_block),
    ),

    schedule: $ => choice(
      seq(field('name', $.schedule_name), optional(seq('chunks', field('chunks', $._int_or_hole)))),
      $.hole,
    ),

    // SCHEDULE: /(?!(microbatches|chunks)\b)[A-Za-z0-9_]+/, a word that may start with a digit (`1f1b`),
    // lexed only after `schedule`
    schedule_name: _ => wordExcept(['microbatches', 'chunks']),

    stage_block: $ => choice(
      seq('{', lines($, $.stage), '}'),
      seq('{', optional($._terminators), $.hole, optional($._terminators), '}'),
    ),

    stage: $ => seq(
      'stage',
      commaList1($.path),
      optional(seq('with', commaList1($.degree))),
    ),

    degree: $ => seq(field('axis', $._name), '=', field('size', $._int_or_hole)),

    // ------------------------------------------------------------------ checkpointing
    checkpoint_statement: $ => choice(
      seq('checkpoint', commaList1($.path), optional(seq('every', field('every', $._every)))),
      seq('checkpoint', $.hole),
    ),

    _every: $ => choice($.integer, $.hole, $._name),

    // ------------------------------------------------------------------ templates
    template_declaration: $ => seq(
      'template',
      field('name', $._name),
      field('parameters', $.parameters),
      field('body', $.block),
    ),

    parameters: $ => seq('(', commaSep($.parameter), ')'),

    parameter: $ => seq(field('name', $._name), ':', field('kind', $._name)),

    apply_statement: $ => seq(
      'apply',
      field('template', $.dotted_name),
      optional(field('arguments', $.template_arguments)),
      'to',
      field('target', $.path),
    ),

    template_arguments: $ => seq('(', commaSep($._value), ')'),

    for_statement: $ => seq(
      'for',
      field('variable', $._name),
      'in',
      field('modules', $.path),
      field('body', $.block),
    ),

    block: $ => seq('{', lines($, $._body_statement), '}'),

    // ------------------------------------------------------------------ paths (module selections)
    // h[*].mlp.c_fc.weight   h[0:6]   layers.*.attn   [0].weight (Sequential)   **.bias
    path: $ => choice(
      seq($._segment, repeat(seq('.', $._segment))),
      seq(repeat1($._selector), repeat(seq('.', $._segment))),
    ),

    _segment: $ => seq(choice($._name, $.glob), repeat($._selector)),

    _selector: $ => choice($.index, $.slice, $.star),

    index: $ => seq('[', $.integer, ']'),

    slice: $ => seq('[', optional(field('start', $.integer)), ':', optional(field('end', $.integer)), ']'),

    star: _ => seq('[', '*', ']'),

    glob: _ => /\*\*|([A-Za-z_][A-Za-z0-9_]*)?\*[A-Za-z0-9_*]*/,

    // ------------------------------------------------------------------ values
    _value: $ => choice(
      $.quantity,
      $.integer,
      $.float,
      $.string,
      $.dotted_name,
      $.hole,
      $.list,
    ),

    quantity: $ => seq(field('number', choice($.integer, $.float)), field('unit', $.unit)),

    // unit: NAME ["/" NAME] -- a plain name, never a keyword
    unit: $ => seq($.identifier, optional(seq('/', $.identifier))),

    list: $ => seq('[', commaSep($._value), ']'),

    _int_or_hole: $ => choice($.integer, $.hole),

    _axis_or_hole: $ => choice($._name, $.hole),

    hole: _ => '?',

    dotted_name: $ => seq($._name, repeat(seq('.', $._name))),

    _name: $ => choice($.identifier, ...SOFT_KEYWORDS.map(word => alias(word, $.identifier))),

    identifier: _ => /[A-Za-z_][A-Za-z0-9_]*/,

    integer: _ => /[0-9](_?[0-9])*/,

    float: _ => token(choice(
      /[0-9](_?[0-9])*\.[0-9](_?[0-9])*([eE][+-]?[0-9]+)?/,
      /[0-9](_?[0-9])*[eE][+-]?[0-9]+/,
    )),

    string: _ => /"([^"\\\n]|\\.)*"/,

    comment: _ => token(seq('#', /[^\n]*/)),
  },
});

/** The items of a `{ }` block: `_nl? (item _term)* item?` */
function lines($, rule) {
  return seq(
    optional($._terminators),
    repeat(seq(rule, $._terminators)),
    optional(rule),
  );
}

/**
 * A regex for the words of [A-Za-z0-9_]+ other than `excluded` (tree-sitter's regexes have no
 * look-ahead). A word is not excluded when it starts with none of their first characters, or, for an
 * excluded word it starts like, when it leaves that word at some character, stops inside it or runs past
 * it. (Lexing takes the longest match, so an excluded word itself lexes as a shorter token and an error.)
 */
function wordExcept(excluded) {
  const word = '[A-Za-z0-9_]';
  const wordWithout = chars => {
    const kept = [];
    for (const [first, last] of [['A', 'Z'], ['a', 'z'], ['0', '9']]) {
      for (let c = first.charCodeAt(0); c <= last.charCodeAt(0); c++) kept.push(String.fromCharCode(c));
    }
    kept.push('_');
    return '[' + kept.filter(c => !chars.includes(c)).join('') + ']';
  };
  const alternatives = [wordWithout(excluded.map(w => w[0])) + word + '*'];
  for (const w of excluded) {
    for (let k = 1; k < w.length; k++) {
      alternatives.push(w.slice(0, k)); // stops inside it
      alternatives.push(w.slice(0, k) + wordWithout([w[k]]) + word + '*'); // leaves it
    }
    alternatives.push(w + word + '+'); // runs past it
  }
  return new RegExp(alternatives.join('|'));
}
