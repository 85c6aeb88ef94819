#!/usr/bin/env node
// Writes tests/fixtures/gpt2_bpe_expected.json: test strings and the token ids
// GPT-2's byte-level BPE gives them, computed by the npm package gpt-3-encoder's
// Encoder.js (a line-by-line JavaScript port of OpenAI's gpt-2/src/encoder.py).
// The C++ tokenizer (src/data/gpt2_tokenizer.cpp) must reproduce these ids.
//
//   bash scripts/fetch_data.sh && node tools/make_bpe_fixture.js
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const pkg = path.join(root, 'third_party', 'npm', 'gpt-3-encoder');
if (!fs.existsSync(path.join(pkg, 'Encoder.js'))) {
  console.error(`make_bpe_fixture: ${pkg}/Encoder.js not found. hint: run bash scripts/fetch_data.sh first`);
  process.exit(1);
}
const { encode, decode } = require(path.join(pkg, 'Encoder.js'));

const strings = [
  'Hello world',
  'hello, world!',
  'The quick brown fox jumps over the lazy dog.',
  // contractions (the regex's first alternatives)
  "I'm don't we'll they've she'd it's",
  "You're right: it'd be THEIR'S, 'tis so.",
  // whitespace runs (\s+(?!\S) leaves the last space to the next word)
  'a   b\n\n\tc  ',
  '   leading spaces',
  'trailing spaces   ',
  'line one\nline two\r\nline three\n',
  '\t\ttabs\tand\u00a0no-break space',
  // numbers
  'In 1987 there were 3,141,592 people and 2.5e10 ants; call 555-0123.',
  'x1 = 42x + 0.001; y_2 = 1234567890',
  // punctuation
  'Wait... what?! (Really) [yes] {no} <maybe> "quoted" --dash-- @user #tag $5 100% a&b *star*',
  '!!!???...,,,;;;:::',
  'e-mail: someone@example.com, url: https://example.org/path?q=1&r=2',
  // unicode
  'café résumé naïve — “smart quotes” and ‘single’ ones',
  'Ünïcödé façade, Straße, Øre, ﬁ ligature',
  '日本語のテキストです。東京タワー',
  '한국어 텍스트와 中文字符',
  'Здравствуй, мир! Γειά σου Κόσμε',
  'emoji: 😀 🎉👍🏽 🇺🇸 👨‍👩‍👧‍👦!',
  'math: ∑ x² ≤ ∞, π ≈ 3.14159, √2',
  // GPT-2's special token is plain text to encoder.py
  'text<|endoftext|>more',
  // a longer passage
  'The Fulton County Grand Jury said Friday an investigation of Atlanta\'s recent primary election produced "no evidence" that any irregularities took place.',
];

const cases = strings.map(s => {
  const ids = encode(s);
  const back = decode(ids);
  if (back !== s) throw new Error(`Encoder.js does not round-trip ${JSON.stringify(s)}`);
  return { text: s, ids };
});

const out = {
  generator: 'tools/make_bpe_fixture.js with gpt-3-encoder@1.1.4 Encoder.js',
  cases,
};
const dest = path.join(root, 'tests', 'fixtures', 'gpt2_bpe_expected.json');
// One case per line: readable diffs when the fixture changes.
const lines = cases.map(c => '  ' + JSON.stringify(c));
const text = '{\n "generator": ' + JSON.stringify(out.generator) + ',\n "cases": [\n' + lines.join(',\n') + '\n ]\n}\n';
JSON.parse(text);  // sanity
fs.writeFileSync(dest, text);
console.log(`make_bpe_fixture: wrote ${cases.length} cases to ${dest}`);
