// onnx-drift-workbench download links (anywidget ESM, no dependencies). A link carries a token, not the file:
// clicking it asks the kernel for the bytes, which come back in chunks (custom messages with binary buffers) and
// are saved by the browser under the link's name. Nothing is inlined in the page or in the notebook's widget
// state, so a file of any size up to the server's limit travels once, when asked, even from a remote kernel.
const REG = (globalThis.__wbDownloads ??= { servers: new Map(), installed: false });

function note(link, text, kind) {
  let span = link.nextElementSibling;
  if (!span || !span.classList.contains("wb-download-note")) {
    span = document.createElement("span");
    span.className = "wb-download-note";
    link.after(span);
  }
  span.textContent = text ? ` ${text}` : "";
  span.dataset.kind = kind || "";
}

function install() {
  if (REG.installed) return;
  REG.installed = true;
  document.addEventListener("click", (event) => {
    const link = event.target && event.target.closest ? event.target.closest("a[data-wb-download]") : null;
    if (!link) return;
    event.preventDefault();
    event.stopPropagation();
    const [server, token] = link.dataset.wbDownload.split(":");
    const entry = REG.servers.get(server);
    if (!entry) {
      note(link, "(the kernel that wrote this file is gone: run the cell again to download it)", "error");
      return;
    }
    entry.links.set(token, link);
    note(link, "(downloading...)", "busy");
    entry.model.send({ get: token });
  }, true);
}

function initialize({ model }) {
  const id = model.get("server_id");
  const entry = { model, links: new Map(), parts: new Map() };
  REG.servers.set(id, entry);
  model.on("msg:custom", (msg, buffers) => {
    if (!msg || !msg.token) return;
    const link = entry.links.get(msg.token);
    if (msg.error) {
      entry.parts.delete(msg.token);
      if (link) note(link, `(${msg.error})`, "error");
      return;
    }
    const parts = entry.parts.get(msg.token) || [];
    for (const b of buffers || []) parts.push(b);
    entry.parts.set(msg.token, parts);
    if (link && msg.size) note(link, `(${Math.round((100 * msg.sent) / msg.size)}%)`, "busy");
    if (!msg.last) return;
    entry.parts.delete(msg.token);
    const url = URL.createObjectURL(new Blob(parts, { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = msg.name;
    a.style.display = "none";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    if (link) note(link, "", "");
  });
  install();
  return () => {
    if (REG.servers.get(id) === entry) REG.servers.delete(id);
  };
}

export default { initialize, render({ el }) { el.style.display = "none"; } };
