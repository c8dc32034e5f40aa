// The second implementation cache/schemas/regex.py is held to: V8's own RegExp with the u flag.
// Reads {"patterns": [...], "subjects": [[...], ...]} on stdin and writes {"answers": [...], "later": [...]}:
// for each pattern null if `new RegExp(pattern, "u")` is a SyntaxError, else whether it matches each
// subject somewhere (RegExp.prototype.test: a search, as JSON Schema's `pattern` is); and which syntax
// newer than ECMA-262 2024 this node has (regex_differential.LATER).
"use strict";

function compiles(pattern) {
  try {
    new RegExp(pattern, "u");
    return true;
  } catch (error) {
    return false;
  }
}

const later = Object.entries({ modifiers: "(?i:a)", "duplicate-names": "(?<a>x)|(?<a>y)" })
  .filter(([, example]) => compiles(example))
  .map(([name]) => name);

const chunks = [];
process.stdin.on("data", (chunk) => chunks.push(chunk));
process.stdin.on("end", () => {
  const { patterns, subjects } = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const answers = patterns.map((pattern, i) => {
    let regex;
    try {
      regex = new RegExp(pattern, "u");
    } catch (error) {
      if (error instanceof SyntaxError) return null;
      throw error;
    }
    return subjects[i].map((subject) => regex.test(subject));
  });
  process.stdout.write(JSON.stringify({ answers, later }));
});
