/* course_attn site: how the search page ranks its results (html_search_scorer; Sphinx puts
   this file into _static/language_data.js, after searchtools.js, so this Scorer replaces
   Sphinx's own). Sphinx's weights are kept; score() then reorders for the reader:

   1. the chapter that teaches the query (tools/course_site.py makes each glossary term a
      main index entry of the chapter whose glossary section lists it);
   2. that chapter's sections whose title holds the query ("8.3 The KV cache");
   3. the glossary's entry for the term (its snippet is the definition, course_search.js);
   4. then as Sphinx ranks, with a page whose own title holds the query before pages that
      only have it in a section heading.

   Before: "KV cache" gave chapter 8 fifth and section 8.3 seventh, "FlashAttention" gave
   chapter 9 fourth (ties at 15 points broken alphabetically: Chapter 10 < Chapter 5).
   tests/site_check.py checks the first results of a few queries. */
var Scorer = {
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: {0: 15, 1: 5, 2: -5},
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,

  // the query of the page's URL, lower case, and the pages that teach it
  _query: null,
  _teaching: null,
  _prepare: function () {
    var query = (new URLSearchParams(window.location.search).get("q") || "")
      .toLowerCase().replace(/\s+/g, " ").trim();
    if (query === this._query && this._teaching) return;
    this._query = query;
    this._teaching = new Set();
    var index = (typeof Search !== "undefined" && Search._index) || {};
    var entries = (index.indexentries || {})[query] || [];
    var glossary = "book/glossary";
    var self = this;
    entries.forEach(function (entry) {
      var docname = (index.docnames || [])[entry[0]];
      if (docname && docname !== glossary && entry[2]) self._teaching.add(docname);
    });
  },

  score: function (result) {
    Scorer._prepare();
    var docname = result[0], title = String(result[1] || ""), anchor = result[2] || "";
    var score = result[4], query = Scorer._query;
    if (!query) return score;
    var section = title.split(" > ").slice(1).join(" > ");
    if (Scorer._teaching.has(docname)) {
      if (!anchor) return 103;
      if (section.toLowerCase().indexOf(query) !== -1) return 102;
    }
    if (docname === "book/glossary" && anchor.indexOf("#term-") === 0 && score >= 100) {
      return 101;  // the glossary's own entry for the term (the whole query, 100 points)
    }
    if (!anchor && title.toLowerCase().indexOf(query) !== -1) return score + 5;  // own title
    return score;
  },
};
