// The Jupyter widgets typeset their labels with MathJax 2 (MathJax.Hub.Queue); the book loads MathJax 3.
// Give MathJax 3 that one entry point, before the widget manager draws the views on the page's load event.
window.addEventListener("load", () => {
  const mathjax = window.MathJax;
  if (mathjax && !mathjax.Hub && mathjax.typesetPromise) {
    mathjax.Hub = {
      Queue: ([, , element]) => {  // ["Typeset", MathJax.Hub, element]; MathJax 3 wants one typeset at a time
        mathjax.startup.promise = mathjax.startup.promise.then(() => mathjax.typesetPromise([element]));
      },
    };
  }
});
