/* course_attn site, every page (tools/course_site.py adds this file).
   A display formula wider than its column scrolls inside its own box (course.css). Phones
   show no scroll bar, so the box is marked on the side where the formula goes on
   (course-more-right / course-more-left), and course.css fades that edge out. */
(function () {
  "use strict";
  var BOXES = 'div.math mjx-container[display="true"]';

  function mark(box) {
    var hidden = box.scrollWidth - box.clientWidth;
    box.classList.toggle("course-more-right", hidden > 1 && box.scrollLeft < hidden - 1);
    box.classList.toggle("course-more-left", hidden > 1 && box.scrollLeft > 1);
  }

  function watch() {
    var resized = window.ResizeObserver ? new ResizeObserver(function (entries) {
      entries.forEach(function (entry) { mark(entry.target); });
    }) : null;
    document.querySelectorAll(BOXES).forEach(function (box) {
      box.addEventListener("scroll", function () { mark(box); }, {passive: true});
      if (resized) resized.observe(box);
      mark(box);
    });
    window.addEventListener("resize", function () {
      document.querySelectorAll(BOXES).forEach(mark);
    });
  }

  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(watch);
    else if (document.querySelector(BOXES)) watch();
  });
})();
