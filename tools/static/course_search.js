/* course_attn site, search page only (tools/course_site.py adds this file).
   Sphinx's search shows page titles from searchindex.js and a snippet of each page's text
   taken from its HTML, where every formula is still TeX source (MathJax draws it only on
   the page itself): a snippet read "divides by \(\sqrt{d_k}\)", a title "-\infty". Here
   formulas in snippets and titles become plain text ("divides by √d_k", "-∞") before they
   are shown. A snippet is taken from the article itself (not the page's table of contents,
   not its title, no equation numbers), starts at the sentence of the first match in the
   prose (issue 44: not in a code name), and a glossary hit shows the term's definition. tests/site_check.py searches the site and
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
  var CODE = "\u2063";  // an invisible separator: marks where code starts and ends
  var NOT_TEXT = "#jb-print-docs-body, .onlyprint, .bd-header-article, .bd-sidebar-secondary, " +
    ".prev-next-area, .bd-footer-article, footer, .headerlink, span.eqno";
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
    // Innermost groups first. A plain group {x} loses its braces only in a round where
    // nothing else changed: dropped with the rest, the braces of \frac{QK^\top}{\sqrt{d_k}}
    // went before \frac could read its arguments ("fracQK^⊤√d_k", chapter 4).
    for (var round = 0; round < 16; round += 1) {
      var before = s;
      s = s.replace(FONTS, "$1")
        .replace(/\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, function (m, a, b) {
          return group(a.trim()) + "/" + group(b.trim());
        })
        .replace(/\\sqrt\s*\{([^{}]*)\}/g, function (m, a) { return "√" + group(a.trim()); })
        .replace(/([_^])\{([^{}]*)\}/g, function (m, op, a) {
          return op + (a.trim().length > 1 ? group(a.trim()) : a.trim());
        });
      if (s === before) s = s.replace(/\{([^{}]*)\}/g, "$1");
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
      // Not the page's furniture: the print-only table of contents and the header's buttons
      // inside the theme's main element made "Contents 9.1 Where the memory goes ..." the
      // snippet of most chapters; an equation's number and "#" link made chapter 4's
      // "(4.1)# Attention(Q, ...". Removed before the formulas become text, as they sit
      // inside a formula's element.
      doc.querySelectorAll(NOT_TEXT).forEach(function (el) { el.remove(); });
      doc.querySelectorAll(".math").forEach(function (el) {
        el.replaceWith(doc.createTextNode(" " + texToText(el.textContent) + " "));
      });
      // The page's title: the result shows it above the snippet already.
      var title = doc.querySelector('[role="main"] h1');
      if (title && !anchor) title.remove();
      // Code (cells, names in the prose) between two CODE marks: the snippet prefers a match
      // outside them, and drops the marks.
      doc.querySelectorAll("pre, code").forEach(function (el) {
        if (el.parentElement && el.parentElement.closest("pre, code")) return;
        el.prepend(doc.createTextNode(CODE));
        el.append(doc.createTextNode(CODE));
      });
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
    // The snippet: Sphinx's starts 120 characters before the first match, mid-word
    // ("...apter 9: Efficient"), and a match inside a code name counts ("induction" gave
    // chapter 11's list of names: "induction_attention_score"). Here it starts at the
    // sentence of the first match in the prose (a word not joined to a name by "_" or "."),
    // else of the first match, and ends at a word.
    Search.makeSearchSummary = function (htmlText, keywords, anchor) {
      var marked = Search.htmlToText(htmlText, anchor).replace(/\s+/g, " ").trim();
      var inCode = [], text = "";
      for (var i = 0, code = false; i < marked.length; i += 1) {
        if (marked[i] === CODE) code = !code;
        else { text += marked[i]; inCode.push(code); }
      }
      text = text.trim();
      if (text === "") return null;
      var lower = text.toLowerCase(), prose = -1, any = -1;
      function find(words) {  // the first match in the prose (and the first of all)
        words.forEach(function (word) {
          word = word.toLowerCase();
          for (var at = lower.indexOf(word); at > -1; at = lower.indexOf(word, at + 1)) {
            if (any < 0 || at < any) any = at;
            var name = /[\w.]*$/.exec(lower.slice(0, at))[0] +
              /^[\w.]*/.exec(lower.slice(at))[0];
            if (!inCode[at] && !/[_.]/.test(name.replace(/\.$/, ""))) {
              if (prose < 0 || at < prose) prose = at;
              break;
            }
          }
        });
      }
      // the whole query where the prose has it ("causal mask", not the first "mask"), else
      // the first match of any of its words
      var query = (new URLSearchParams(window.location.search).get("q") || "")
        .toLowerCase().replace(/\s+/g, " ").trim();
      if (query.indexOf(" ") > 0) find([query]);
      if (prose < 0) find(Array.from(keywords));
      // from the start of the match's sentence (160 characters back at most), else of its
      // clause, else of a word; to the end of a word
      var hit = prose > -1 ? prose : any, start = 0;
      if (hit > 0 && text.length > 240) {
        var back = Math.max(0, hit - 160), before = text.slice(back, hit);
        var sentence = /^.*[.!?]\s+(?=[A-Z0-9"“(])/.exec(before);
        var clause = /^.*[,;:]\s+/.exec(text.slice(Math.max(back, hit - 100), hit));
        if (sentence) start = back + sentence[0].length;
        else if (clause) start = Math.max(back, hit - 100) + clause[0].length;
        else if (hit > 60) start = text.indexOf(" ", hit - 60) + 1;
      }
      var end = Math.min(text.length, start + 240);
      if (end < text.length) end = Math.max(text.lastIndexOf(" ", end), start + 160);
      var head = start > 0 && !/[.!?]\s*$/.test(text.slice(0, start)) ? "… " : "";
      var summary = document.createElement("p");
      summary.classList.add("context");
      summary.textContent = head + text.slice(start, end).trim() + (end < text.length ? " …" : "");
      return summary;
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
