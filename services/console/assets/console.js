// The submit page's upload: read the chosen file into the editor and check it.
document.addEventListener("DOMContentLoaded", function () {
  var file = document.getElementById("file");
  if (!file) return;
  file.addEventListener("change", function (e) {
    var f = e.target.files[0];
    if (!f) return;
    f.text().then(function (text) {
      var editor = document.getElementById("workflow");
      editor.value = text;
      editor.dispatchEvent(new Event("input", { bubbles: true }));
    });
  });
});
