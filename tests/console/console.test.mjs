// The web console end to end, in real headless Chromium (Debian's), against a real
// `meridian up`: a researcher signs in, writes a workflow with a typo and sees the error
// at its line, fixes it, sees the quote, submits, watches it finish and reads its output
// and bill; a researcher of another tenant gets a 404 for that workflow; an admin drains
// and undrains a site; finance downloads the month's FOCUS export and it equals
// `meridian export focus`; pages a token may not use are refused. Screenshots of the
// main pages go to $MERIDIAN_SCREENSHOTS when set (docs/console/ keeps them).
//
//   MERIDIAN_BIN=target/debug/meridian node --test tests/console/
//
// scripts/test runs it (it installs Debian's chromium and this folder's npm packages).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const bin = resolve(root, process.env.MERIDIAN_BIN ?? "target/debug/meridian");
const chromiumPath = process.env.MERIDIAN_CHROMIUM ?? "/usr/bin/chromium";
const shots = process.env.MERIDIAN_SCREENSHOTS;

const WITH_TYPO = `version: v1
name: from-the-console
jobs:
  prep:
    image: host
    command: [sh, -c, "echo preparing"]
    resources: {cpus: 1, memory: 64MiB, walltime: 5m}
  hello:
    requires: [prep]
    image: host
    command: [sh, -c, "sleep 2; echo hello from a browser, task \${ARRAY_INDEX}"]
    array: {start: 1, end: 3, parallelism: 2}
    resources:
      cpus: 1
      memory: 64MiB
      walltme: 5m
`;
const FIXED = WITH_TYPO.replace("walltme", "walltime");

let dir, server, up, browser, upOutput = "";
const tokens = {};

function freePort() {
  return new Promise((ok) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** One CSV record's fields (RFC 4180 quoting; the export has no newlines in fields). */
function csvLine(line) {
  const fields = [];
  let field = "", quoted = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quoted) {
      if (c === '"' && line[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ",") { fields.push(field); field = ""; }
    else field += c;
  }
  fields.push(field);
  return fields;
}

/** Runs the CLI against the server (with `token`, or the admin profile's). */
function meridian(args, token) {
  const env = { ...process.env, MERIDIAN_CONFIG_DIR: join(dir, "config"), MERIDIAN_SERVER: server };
  if (token) env.MERIDIAN_TOKEN = token;
  return execFileSync(bin, args, { env, encoding: "utf8" });
}

async function waitReady() {
  for (let i = 0; i < 300; i++) {
    try {
      const r = await fetch(`${server}/v1/health`);
      if (r.ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`meridian up did not answer:\n${upOutput}`);
}

async function shot(page, name) {
  if (!shots) return;
  mkdirSync(shots, { recursive: true });
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

/** A fresh browser session signed in with `token`; lands where the console sends it. */
async function signedIn(token) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  const page = await context.newPage();
  await page.goto(`${server}/`);
  assert.match(page.url(), /\/sign-in$/);
  await page.fill("#token", token);
  await page.click("button[type=submit]");
  await page.waitForLoadState();
  return page;
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "meridian-console-"));
  const port = await freePort();
  server = `http://127.0.0.1:${port}`;
  up = spawn(bin, ["up", "--data-dir", join(dir, "data"), "--listen", `127.0.0.1:${port}`, "--local-cpus", "2"], {
    env: { ...process.env, MERIDIAN_CONFIG_DIR: join(dir, "config") },
    stdio: ["ignore", "pipe", "pipe"],
  });
  up.stdout.on("data", (d) => (upOutput += d));
  up.stderr.on("data", (d) => (upOutput += d));
  await waitReady();
  tokens.admin = JSON.parse(readFileSync(join(dir, "config", "client.json"), "utf8")).token;
  const issue = (...args) => meridian(["admin", "token", "create", ...args]).trim();
  tokens.alpha = issue("--tenant", "alpha", "--role", "researcher");
  tokens.beta = issue("--tenant", "beta", "--role", "researcher");
  tokens.finance = issue("--role", "finance");
  browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  up?.kill("SIGTERM");
  if (dir) rmSync(dir, { recursive: true, force: true });
});

let workflowPath;

test("a researcher finds a typo at its line, fixes it, quotes, submits, and watches it finish", async () => {
  const page = await signedIn(tokens.alpha);
  assert.match(page.url(), /\/workflows$/);
  await page.click("a[href='/workflows/new']");
  await page.fill("#workflow", WITH_TYPO);
  // Checked as it is typed: the error sits under line 16, where the typo is.
  const error = page.locator(".field-error[data-path='jobs.hello.resources.walltme']");
  await error.waitFor({ timeout: 10_000 });
  assert.equal(await error.getAttribute("data-line"), "16");
  assert.match(await error.innerText(), /unknown field; expected one of .*walltime/);
  await shot(page, "submit-with-an-error");

  await page.fill("#workflow", FIXED);
  const site = page.locator("#quote-site");
  await site.waitFor({ timeout: 10_000 });
  assert.equal(await site.innerText(), "local");
  assert.equal(await page.locator(".field-error").count(), 0);
  const local = page.locator("table.candidates tr[data-site='local']");
  assert.match(await local.innerText(), /chosen/);
  await shot(page, "submit-quoted");

  await Promise.all([page.waitForURL(/\/workflows\/[0-9a-f-]{36}$/), page.click("button[value=submit]")]);
  workflowPath = new URL(page.url()).pathname;
  // The page refreshes itself while the workflow runs, the array's progress with it...
  await page.locator("[data-node='hello'] .note", { hasText: /tasks: [0-2] of 3 done/ }).waitFor({ timeout: 30_000 });
  await page.locator("#live[data-state='finished']").waitFor({ timeout: 60_000 });
  // ...and once it has ended, reloads whole: the final state in the title, no Cancel.
  await page.locator("h1 .state.finished").waitFor({ timeout: 10_000 });
  assert.equal(await page.locator("button.danger", { hasText: "Cancel" }).count(), 0);
  // The DAG: prep, then the three-task array after it, every task done.
  assert.match(await page.locator("[data-node='prep']").innerText(), /succeeded/);
  const array = await page.locator("[data-node='hello']").innerText();
  assert.match(array, /succeeded/);
  assert.match(array, /tasks: 3 of 3 done/);
  assert.match(array, /after prep/);
  // The bill may need another reload: the ledger follows the log by a moment.
  for (let i = 0; i < 50; i++) {
    await page.reload();
    if ((await page.locator("#bill-lines").count()) > 0) break;
    await page.waitForTimeout(200);
  }
  assert.match(await page.locator("main").innerText(), /hello from a browser, task 3/);
  const bill = await page.locator("#bill-lines").innerText();
  assert.match(bill, /Core-Hours/);
  assert.match(bill, /Total/);
  await shot(page, "workflow");
  await page.goto(`${server}/workflows`);
  assert.match(await page.locator("#workflows").innerText(), /from-the-console/);
  await shot(page, "workflows");
  await page.context().close();
});

test("a researcher of another tenant cannot open that workflow", async () => {
  assert.ok(workflowPath, "the first test submitted a workflow");
  const page = await signedIn(tokens.beta);
  const response = await page.goto(`${server}${workflowPath}`);
  assert.equal(response.status(), 404);
  assert.match(await page.locator("main").innerText(), /no workflow/);
  // Nor is it in their list.
  await page.goto(`${server}/workflows`);
  assert.doesNotMatch(await page.locator("main").innerText(), /from-the-console/);
  // Nor may they reach admin or finance pages.
  for (const path of ["/tenants", "/finance"]) {
    assert.equal((await page.goto(`${server}${path}`)).status(), 403, path);
  }
  await page.context().close();
});

test("an admin drains a site, sees why work runs where it does, and undrains it", async () => {
  const page = await signedIn(tokens.admin);
  await page.goto(`${server}/sites`);
  const row = page.locator("#sites tr[data-site='local']");
  await row.locator("input[name=reason]").fill("disk replacement");
  await Promise.all([
    page.waitForResponse((r) => r.url().endsWith("/sites/local/drain")),
    row.locator("button", { hasText: "Drain" }).click(),
  ]);
  await page.waitForLoadState();
  await row.locator(".state.drained").waitFor();
  const listed = JSON.parse(meridian(["site", "list", "-o", "json"]));
  assert.equal(listed.sites.find((s) => s.name === "local").state, "drained");
  await shot(page, "sites");
  await Promise.all([
    page.waitForResponse((r) => r.url().endsWith("/sites/local/undrain")),
    row.locator("button", { hasText: "Undrain" }).click(),
  ]);
  await page.waitForLoadState();
  await row.locator("button", { hasText: "Drain" }).waitFor();
  assert.doesNotMatch(await row.innerText(), /drained/);
  // The placement explanation, each cost term a column.
  await page.goto(`${server}${workflowPath}`);
  const why = await page.locator("table.candidates").first().innerText();
  for (const term of ["Compute", "Data in", "Storage", "Data out", "Total"]) assert.match(why, new RegExp(term));
  await page.goto(`${server}/tenants`);
  assert.match(await page.locator("section[data-tenant='alpha']").innerText(), /researcher/);
  await shot(page, "tenants");
  await page.context().close();
});

test("finance downloads the month's export, and it is the CLI's", async () => {
  const page = await signedIn(tokens.finance);
  assert.match(page.url(), /\/finance$/);
  const month = new Date().toISOString().slice(0, 7);
  const text = await page.locator("main").innerText();
  assert.match(text, /alpha/);
  // The tenant's total on the page is the sum of the export's BilledCost.
  assert.equal(await page.locator("svg#per-day-USD rect").count() > 0, true);
  await shot(page, "finance");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#download")]);
  const saved = join(dir, "download.csv");
  await download.saveAs(saved);
  const exported = meridian(["export", "focus", "--period", month], tokens.finance);
  assert.equal(readFileSync(saved, "utf8"), exported);
  const [head, ...rows] = exported.trim().split("\n").map(csvLine);
  const column = head.indexOf("BilledCost");
  const alpha = rows.filter((r) => r[0] === "alpha");
  assert.ok(alpha.length > 0, exported);
  const shownTitle = await page.locator("#by-tenant tr[data-key='alpha'] .amount").getAttribute("title");
  const shown = Number(shownTitle.split(" ")[0]);
  const summed = alpha.reduce((t, r) => t + Number(r[column]), 0);
  assert.ok(Math.abs(shown - summed) < 1e-12, `page ${shownTitle} vs export ${summed}`);
  assert.match(exported, /from-the-console|alpha/);
  // Finance does not submit or manage tokens.
  for (const path of ["/workflows/new", "/tenants"]) {
    assert.equal((await page.goto(`${server}${path}`)).status(), 403, path);
  }
  await page.context().close();
});
