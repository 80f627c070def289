/* course_attn site, every page (tools/course_site.py adds this file).
   Formulas and code that are wider than the column (course.css):
   - a formula a little wider than its column (or line) is drawn smaller, down to MIN_SCALE
     of its size, so that it fits (chapter 9's backward pass at 1280 px: 753 px in 688);
   - what still does not fit scrolls inside its own box (display formulas, an inline
     formula wider than its line, which gets the class course-wide, code blocks); phones
     show no scroll bar, so the box is marked on the side where the content goes on
     (course-more-right / course-more-left), and course.css fades that edge out.
   Everything is measured again when the column changes width (window, sidebars). */
(function () {
  "use strict";
  var MIN_SCALE = 0.8;
  var DISPLAY = 'div.math mjx-container[display="true"]';
  var INLINE = "span.math";
  var CODE = "div.highlight pre, div.cell_output pre";
  var watched = new WeakSet();

  function mark(box) {
    var hidden = box.scrollWidth - box.clientWidth;
    box.classList.toggle("course-more-right", hidden > 1 && box.scrollLeft < hidden - 1);
    box.classList.toggle("course-more-left", hidden > 1 && box.scrollLeft > 1);
  }

  function watchScroll(box) {
    if (watched.has(box)) return;
    watched.add(box);
    box.addEventListener("scroll", function () { mark(box); }, {passive: true});
  }

  // The width of the line an inline element sits on: its first block ancestor's content box.
  function lineWidth(el) {
    for (var p = el.parentElement; p; p = p.parentElement) {
      var s = getComputedStyle(p);
      if (s.display.indexOf("inline") !== 0 && s.display !== "contents") {
        return p.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
      }
    }
    return Infinity;
  }

  // Draw the formula in box smaller, down to MIN_SCALE, until it fits room px.
  function shrink(box, room) {
    var math = box.querySelector("mjx-math");
    if (!math) return null;
    math.style.fontSize = "";
    var natural = math.getBoundingClientRect().width;
    if (natural > room + 0.5 && room > 0) {
      var scale = Math.max(MIN_SCALE, Math.floor(100 * room / natural) / 100);
      math.style.fontSize = (100 * scale).toFixed(0) + "%";
      box.dataset.courseScale = scale.toFixed(2);
    } else {
      delete box.dataset.courseScale;
    }
    return math;
  }

  function fitDisplay(box) {
    if (!shrink(box, box.clientWidth)) return;
    watchScroll(box);
    mark(box);
  }

  function fitInline(span) {
    var room = lineWidth(span), math = shrink(span, room);
    if (!math) return;
    var wide = math.getBoundingClientRect().width > room + 0.5;
    span.classList.toggle("course-wide", wide);
    if (wide) watchScroll(span);
    mark(span);
  }

  function fitCode(pre) {
    watchScroll(pre);
    mark(pre);
  }

  function fitFormulas() {
    document.querySelectorAll(DISPLAY).forEach(fitDisplay);
    document.querySelectorAll(INLINE).forEach(fitInline);
  }

  function fitAll() {
    fitFormulas();
    document.querySelectorAll(CODE).forEach(fitCode);
  }

  function watch() {
    fitAll();
    var column = document.querySelector("article.bd-article") || document.body;
    var width = column.clientWidth;
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        if (column.clientWidth === width) return;  // only a new width changes what fits
        width = column.clientWidth;
        window.requestAnimationFrame(fitAll);
      }).observe(column);
    } else {
      window.addEventListener("resize", fitAll);
    }
    // A folded solution lays its code out only when it opens.
    document.querySelectorAll("details").forEach(function (fold) {
      fold.addEventListener("toggle", function () {
        if (fold.open) fold.querySelectorAll(CODE).forEach(fitCode);
      });
    });
  }

  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(watch);
    else watch();
  });
})();
