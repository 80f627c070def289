/* course_attn site, search page only (tools/course_site.py adds this file).
   Sphinx's search shows page titles from searchindex.js and a snippet of each page's text
   taken from its HTML, where every formula is still TeX source (MathJax draws it only on
   the page itself): a snippet read "divides by \(\sqrt{d_k}\)", a title "-\infty". Here
   formulas in snippets and titles become plain text ("divides by √d_k", "-∞") before they
   are shown. A snippet is taken from the article itself (not the page's table of contents),
   and a glossary hit shows the term's definition. tests/site_check.py searches the site and
   fails on raw TeX, on a table of contents as the first snippet, and on a glossary hit
   without its definition. The ranking is tools/search_scorer.js. */
(function () {
  "use strict";
  var SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε",
    zeta: "ζ", eta: "η", theta: "θ", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ",
    pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ",
    omega: "ω", Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Pi: "Π", Sigma: "Σ",
    Phi: "Φ", Psi: "Ψ", Omega: "Ω", ell: "ℓ", infty: "∞", cdot: "·", cdots: "⋯",
    ldots: "…", dots: "…", times: "×", div: "÷", le: "≤", leq: "≤", ge: "≥", geq: "≥",
    ne: "≠", neq: "≠", approx: "≈", sim: "∼", equiv: "≡", propto: "∝", to: "→",
    rightarrow: "→", Rightarrow: "⇒", leftarrow: "←", gets: "←", mapsto: "↦", in: "∈",
    notin: "∉", sum: "∑", prod: "∏", int: "∫", partial: "∂", nabla: "∇", top: "⊤",
    intercal: "⊤", pm: "±", mp: "∓", odot: "⊙", otimes: "⊗", oplus: "⊕", circ: "∘",
    ast: "∗", star: "⋆", forall: "∀", exists: "∃", cup: "∪", cap: "∩", subset: "⊂",
    subseteq: "⊆", mid: "|", Vert: "‖", lVert: "‖", rVert: "‖", lvert: "|", rvert: "|",
    langle: "⟨", rangle: "⟩", lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉",
    prime: "′", quad: " ", qquad: " ", lbrace: "{", rbrace: "}"
  };
  var NOT_TEXT = "#jb-print-docs-body, .onlyprint, .bd-header-article, .bd-sidebar-secondary, " +
    ".prev-next-area, .bd-footer-article, footer, .headerlink";
  var DROPPED = /\\(?:left|right|big|Big|bigg|Bigg|displaystyle|textstyle|limits|nolimits)\b/g;
  var FONTS = /\\(?:text|textrm|textbf|textit|texttt|mathrm|mathbf|mathit|mathsf|mathtt|mathcal|mathbb|boldsymbol|operatorname\*?|mbox)\s*\{([^{}]*)\}/g;

  function group(text) {  // a / b needs brackets around a sum, not around a single symbol
    return /^[\w.′∞]+$|^\(.*\)$/.test(text) ? text : "(" + text + ")";
  }

  function texToText(tex) {
    var s = tex.replace(/\\\(|\\\)|\\\[|\\\]|\$\$?/g, " ")
      .replace(/\\(?:begin|end)\s*\{[^{}]*\}(?:\{[^{}]*\})?/g, " ")
      .replace(DROPPED, "")
      .replace(/\\[,;:!> ]/g, " ")
      .replace(/\\\\/g, "; ")
      .replace(/\\([{}%&#_$])/g, function (m, c) { return "\u0001" + c.charCodeAt(0) + "\u0002"; });
    for (var round = 0; round < 8; round += 1) {  // innermost groups first
      var before = s;
      s = s.replace(FONTS, "$1")
        .replace(/\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, function (m, a, b) {
          return group(a.trim()) + "/" + group(b.trim());
        })
        .replace(/\\sqrt\s*\{([^{}]*)\}/g, function (m, a) { return "√" + group(a.trim()); })
        .replace(/([_^])\{([^{}]*)\}/g, function (m, op, a) {
          return op + (a.trim().length > 1 ? group(a.trim()) : a.trim());
        })
        .replace(/\{([^{}]*)\}/g, "$1");
      if (s === before) break;
    }
    s = s.replace(/\\([A-Za-z]+)/g, function (m, name) {
      return Object.prototype.hasOwnProperty.call(SYMBOLS, name) ? SYMBOLS[name] : name;
    })
      .replace(/[{}]/g, "")
      .replace(/&/g, " ")
      .replace(/\\/g, "")
      .replace(/\u0001(\d+)\u0002/g, function (m, code) { return String.fromCharCode(+code); });
    return s.replace(/\s+/g, " ").trim();
  }

  // Titles: "5.2 Building the mask: -\infty before softmax" (TeX only where a backslash is).
  function plainTitle(title) {
    return /\\[A-Za-z]/.test(title) ? title.replace(/(\\[A-Za-z]+(?:\s*\{[^{}]*\})*|[_^]\{[^{}]*\})+/g,
      function (m) { return texToText(m); }) : title;
  }

  function rekey(table) {
    if (!table) return table;
    var out = {};
    Object.keys(table).forEach(function (key) { out[plainTitle(key)] = table[key]; });
    return out;
  }

  function plainIndex(index) {
    if (index) {
      if (Array.isArray(index.titles)) index.titles = index.titles.map(plainTitle);
      index.alltitles = rekey(index.alltitles);
      index.indexentries = rekey(index.indexentries);
    }
    return index;
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (typeof Search === "undefined") return;
    var toText = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      var doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(".math").forEach(function (el) {
        el.replaceWith(doc.createTextNode(texToText(el.textContent)));
      });
      // Not the page's furniture: the print-only table of contents and the header's buttons
      // inside the theme's main element made "Contents 9.1 Where the memory goes ..." the
      // snippet of most chapters.
      doc.querySelectorAll(NOT_TEXT).forEach(function (el) { el.remove(); });
      // A glossary term: the term and its definition, not the term alone.
      var term = anchor && doc.querySelector('[role="main"] dt' + anchor);
      if (term) {
        var definition = term.nextElementSibling;
        var words = term.textContent.trim();
        if (definition && definition.tagName === "DD") {
          words += ": " + definition.textContent.replace(/\s+/g, " ").trim();
        }
        return words;
      }
      return toText(doc.documentElement.outerHTML, anchor);
    };
    // searchindex.js has usually called Search.setIndex before this runs; if not, wrap it.
    if (Search._index) {
      plainIndex(Search._index);
    } else {
      var setIndex = Search.setIndex;
      Search.setIndex = function (index) { return setIndex(plainIndex(index)); };
    }
  });
})();
