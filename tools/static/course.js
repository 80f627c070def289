/* course_attn site, every page (tools/course_site.py adds this file).
   Formulas and code that are wider than the column (course.css):
   - a formula a little wider than its column (or line) is drawn smaller, down to MIN_SCALE
     of its size (PHONE_MIN_SCALE on a phone), so that it fits (chapter 9's backward pass at
     1280 px: 753 px in 688);
   - what still does not fit scrolls inside its own box (display formulas, an inline
     formula wider than its line, which gets the class course-wide, code blocks); phones
     show no scroll bar, so the box is marked on the side where the content goes on
     (course-more-right / course-more-left), and course.css fades that edge out.
   - a table wider than its box on a phone lets its headers' long words break before a
     capital (course.css makes its text smaller and its inline code breakable);
   - a figure (SVG) is shown large enough for its smallest text to be 12 px (11 px on a
     phone), but no wider than its room: no figure scrolls or is cut;
   Everything is measured again when the column changes width (window, sidebars).
   Below: a phone's sidebar drawers close after a tap on a link; the download menu offers
   the whole book as one PDF when the site has it; each chapter's widget, drawn ahead,
   shows the figure of the values its controls pick. */
(function () {
  "use strict";
  var MIN_SCALE = 0.8, PHONE_MIN_SCALE = 0.7;  // under 576 px (course.css's phone)
  var DISPLAY = 'div.math mjx-container[display="true"]';
  var INLINE = "span.math";
  var CODE = "div.highlight pre, div.cell_output pre";
  var FIGURES = "div.cell_output img";
  // Figure text (SVG figures): at least this many CSS px on a phone, and on a wider screen.
  var PHONE_TEXT_PX = 11, TEXT_PX = 12;
  var smallestText = new Map();  // an SVG's URL -> a promise of its smallest font size
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
      var least = window.innerWidth < 576 ? PHONE_MIN_SCALE : MIN_SCALE;
      var scale = Math.max(least, Math.floor(100 * room / natural) / 100);
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

  // A table wider than its box: its headers' long words may break before a capital.
  function fitTable(table) {
    var box = table.parentElement;
    if (!box || table.dataset.courseBreaks || table.offsetWidth <= box.clientWidth) return;
    table.dataset.courseBreaks = "yes";
    table.querySelectorAll("th").forEach(function (th) {
      var walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT), nodes = [];
      for (var n = walker.nextNode(); n; n = walker.nextNode()) nodes.push(n);
      nodes.forEach(function (node) {
        var parts = node.nodeValue.split(/(?<=[a-z])(?=[A-Z][a-z])/);
        if (parts.length < 2 || node.parentElement.closest("code, .math")) return;
        var frag = document.createDocumentFragment();
        parts.forEach(function (part, i) {
          if (i) frag.appendChild(document.createElement("wbr"));
          frag.appendChild(document.createTextNode(part));
        });
        node.parentNode.replaceChild(frag, node);
      });
    });
  }

  // The smallest font size an SVG file's texts have, in its own units (matplotlib writes
  // style="font-size: 10px" on each <text>; 1 unit = 1 pt, 4/3 CSS px at its own size).
  function svgSmallestText(url) {
    if (!smallestText.has(url)) {
      smallestText.set(url, fetch(url).then(function (r) { return r.text(); })
        .then(function (text) {
          var sizes = [], found, re = /<text\b[^>]*font-size:\s*([\d.]+)px/g;
          while ((found = re.exec(text)) !== null) sizes.push(parseFloat(found[1]));
          var box = /viewBox="[\d.\s-]*?\s([\d.]+)\s+[\d.]+"/.exec(text);
          return sizes.length && box ? {font: Math.min.apply(null, sizes),
                                        width: parseFloat(box[1])} : null;
        }).catch(function () { return null; }));
    }
    return smallestText.get(url);
  }

  // A figure is shown at least as wide as makes its smallest text TEXT_PX (PHONE_TEXT_PX on
  // a phone): a small figure is drawn larger (it is SVG, sharp at any size), but never wider
  // than its room, so that it is always whole: no figure scrolls or is cut (issue 44). The
  // room: the output's width (on a phone with its 1 rem margins, course.css), or the width
  // of a widget's box of figures.
  function fitFigure(img) {
    var url = img.currentSrc || img.src;
    if (!/\.svg(?:[?#]|$)|^data:image\/svg/i.test(url)) return Promise.resolve();
    if (!img.complete || !img.naturalWidth) {  // a lazy image: when it has loaded
      img.addEventListener("load", function () { fitFigure(img); }, {once: true});
      return Promise.resolve();
    }
    return svgSmallestText(url).then(function (svg) {
      var frames = img.closest("div.course-widget-frames");
      var output = img.closest("div.cell_output");
      if (!svg || !output) return;
      var phone = window.innerWidth < 576;
      var target = (phone ? PHONE_TEXT_PX : TEXT_PX) + 0.05;
      var natural = img.naturalWidth, ownPx = svg.font * natural / svg.width;
      var wanted = Math.ceil(natural * target / ownPx);
      img.style.width = "";
      var room = frames ? frames.clientWidth : output.clientWidth + (phone ? 32 : 0);
      if (room <= 0) return;  // in a closed fold: when it opens
      if (wanted > img.getBoundingClientRect().width + 0.5) {
        img.style.width = Math.min(wanted, room) + "px";
      }
      img.dataset.courseTextPx = (ownPx * img.getBoundingClientRect().width / natural)
        .toFixed(2);
    });
  }

  // A widget drawn ahead (src/course_attn/lab/site_frames.py): no kernel runs on the site,
  // so its controls pick which of its figures, drawn for every combination of their values
  // while the notebook ran, is shown (the key: each control's index, joined by commas).
  function widgetValue(control) {
    return control.type === "checkbox" ? (control.checked ? 1 : 0) : Number(control.value);
  }

  // Its figures are files of the site (tools/course_site.py): the one shown first loads
  // when the widget comes near the screen (loading="lazy"), the others (data-src) when the
  // reader reaches for a control, or at the latest when one is shown.
  function siteWidget(box) {
    var controls = Array.prototype.slice.call(box.querySelectorAll("[data-control]"))
      .sort(function (a, b) { return a.dataset.control - b.dataset.control; });
    var frames = box.querySelectorAll("img.course-widget-frame");
    function load(img) {
      if (img.dataset.src && !img.getAttribute("src")) img.src = img.dataset.src;
    }
    ["pointerenter", "focusin", "touchstart"].forEach(function (type) {
      box.addEventListener(type, function () { frames.forEach(load); },
                           {once: true, passive: true});
    });
    function show() {
      var key = controls.map(widgetValue).join(",");
      controls.forEach(function (control) {
        var shown = control.parentElement.querySelector("output");
        if (shown && control.dataset.labels) {
          shown.textContent = JSON.parse(control.dataset.labels)[widgetValue(control)];
        }
      });
      frames.forEach(function (img) {
        img.hidden = img.dataset.key !== key;
        if (!img.hidden) {
          load(img);
          fitFigure(img);
        }
      });
    }
    controls.forEach(function (control) {
      control.addEventListener("input", show);
      control.addEventListener("change", show);
    });
  }

  function fitFormulas() {
    document.querySelectorAll(DISPLAY).forEach(fitDisplay);
    document.querySelectorAll(INLINE).forEach(fitInline);
  }

  function fitAll() {
    fitFormulas();
    document.querySelectorAll("article table").forEach(fitTable);
    document.querySelectorAll(CODE).forEach(fitCode);
    var figures = Array.prototype.map.call(document.querySelectorAll(FIGURES), fitFigure);
    return Promise.all(figures);
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
        if (!fold.open) return;
        fold.querySelectorAll(CODE).forEach(fitCode);
        fold.querySelectorAll(FIGURES).forEach(fitFigure);
      });
    });
  }

  // A phone's drawers (the theme's <dialog> sidebars): a tap on a link closes the drawer,
  // which stayed open over 75% of the screen after a tap on a section of "Contents". The
  // tooltip a toggle button showed on a tap ("Toggle secondary sidebar") stayed over the
  // header: the toggles have no Bootstrap tooltip.
  function drawers() {
    document.querySelectorAll("dialog.bd-sidebar-primary, dialog.bd-sidebar-secondary, " +
                              "#pst-primary-sidebar-modal, #pst-secondary-sidebar-modal")
      .forEach(function (dialog) {
        dialog.addEventListener("click", function (event) {
          var link = event.target.closest && event.target.closest("a[href]");
          if (link && dialog.open) dialog.close();
        });
      });
    // The toggles keep a plain title (the browser's own tooltip on hover, none on a tap).
    var bs = window.bootstrap;
    var toggles = '.sidebar-toggle[data-bs-toggle="tooltip"]';
    document.querySelectorAll(toggles).forEach(function (button) {
      var tip = bs && bs.Tooltip && bs.Tooltip.getInstance(button);
      var title = button.getAttribute("data-bs-original-title") || button.getAttribute("title");
      if (tip) tip.dispose();
      button.removeAttribute("data-bs-toggle");
      if (title) button.setAttribute("title", title);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawers);
  else drawers();

  // The whole book as one PDF (make pdf; tools/course_site.py sets COURSE_BOOK_PDF when the
  // site has it): an entry of the download menu, under the page's own ".pdf".
  function bookPdf() {
    var menu = document.querySelector(".dropdown-download-buttons ul.dropdown-menu");
    if (!window.COURSE_BOOK_PDF || !menu || menu.querySelector(".course-book-pdf")) return;
    var item = document.createElement("li"), link = document.createElement("a");
    link.href = window.COURSE_BOOK_PDF;
    link.className = "btn btn-sm dropdown-item course-book-pdf";
    link.title = "The whole course as one PDF";
    link.innerHTML = '<span class="btn__icon-container"><i class="fas fa-book"></i></span>' +
      '<span class="btn__text-container">whole book .pdf</span>';
    item.appendChild(link);
    menu.appendChild(item);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", bookPdf);
  else bookPdf();

  function siteWidgets() { document.querySelectorAll("div.course-widget").forEach(siteWidget); }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", siteWidgets);
  } else {
    siteWidgets();
  }

  // tests/site_check.py: fit everything again (every image loaded) and wait for it
  window.courseSite = {fit: fitAll};

  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(watch);
    else watch();
  });
})();
