// The second implementation cache/regex.py is held to: V8's own RegExp with the u flag.
// Reads {"patterns": [...], "subjects": [[...], ...]} on stdin and writes, for each pattern,
// null if `new RegExp(pattern, "u")` is a SyntaxError, else whether it matches each subject
// somewhere (RegExp.prototype.test: a search, as JSON Schema's `pattern` is).
"use strict";

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
  process.stdout.write(JSON.stringify(answers));
});
