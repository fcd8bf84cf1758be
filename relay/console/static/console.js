// The console's only script: "select all" on a list. Everything else is plain forms, so the
// console works without it; no inline script anywhere (the Content-Security-Policy forbids it).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", () => {
      for (const box of document.querySelectorAll("input.pick")) box.checked = all.checked;
    });
  }
});
