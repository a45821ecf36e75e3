// The web console, end to end in headless Chromium against a real
// `cellfleet dev` cluster (three node processes on the local store):
// the page lists three live nodes and shows commands/s once commands run;
// after kill -9 of the owner of a Cell, its lease turns expired and the
// Cell shows a new owner at a later epoch; and a `--console-secure`
// cluster serves only a browser that presents the cluster's client
// certificate. Screenshots go to ARTIFACTS.
//
// Environment: CELLFLEET_BIN (the binary), CHROMIUM (default
// /usr/bin/chromium), ARTIFACTS (screenshot directory). Prints
// "console browser test: ok" and exits 0, or says what failed and exits 1.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { chromium } from "playwright-core";

const run = promisify(execFile);
const bin = process.env.CELLFLEET_BIN;
const artifacts = process.env.ARTIFACTS || join(process.cwd(), "console-screenshots");
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
if (!bin) throw new Error("set CELLFLEET_BIN to the cellfleet binary");
mkdirSync(artifacts, { recursive: true });

const work = mkdtempSync(join(tmpdir(), "cellfleet-console-"));
const data = join(work, "dev");
const env = { ...process.env, CELLFLEET_CONFIG: join(data, "client.toml") };
// Port bases below the kernel's ephemeral range (where other tests'
// port-0 listeners live), below SeaweedFS's 18080.., and apart from the
// website guide's 20000..: a cluster spans base+1..base+403, the secure
// one base+501..base+903.
const bases = [10000, 11000, 12000, 13000, 14000, 15000, 16000, 17000].sort(() => Math.random() - 0.5);
let base = bases[0];
const steps = [];
const step = (text) => { steps.push(text); console.log(`- ${text}`); };

let dev = null;
let secureDev = null;
let devLog = "";
let browser = null;

// Thrown by a check that can never pass (a process exited): `until`
// gives up at once.
class Fatal extends Error {}

async function until(what, check, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      const value = await check();
      if (value) return value;
    } catch (error) {
      if (error instanceof Fatal) throw error;
      last = error;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${last.message})` : ""}`);
}

async function cli(...args) {
  const { stdout } = await run(bin, args, { env, timeout: 60000 });
  return stdout;
}

// Starts `cellfleet dev` on the first port base whose ports are free.
async function startDev() {
  for (const candidate of bases) {
    base = candidate;
    devLog = "";
    dev = spawn(bin, ["dev", "--data", data, "--port-base", String(base), "--lease-ms", "3000"], { env, stdio: ["ignore", "pipe", "pipe"] });
    dev.stdout.on("data", (chunk) => { devLog += chunk; });
    dev.stderr.on("data", (chunk) => { devLog += chunk; });
    try {
      return await until("cellfleet dev to report ready", () => {
        if (dev.exitCode !== null) throw new Fatal(`cellfleet dev exited with ${dev.exitCode}`);
        const line = devLog.split("\n").find((l) => l.startsWith("node pids:"));
        return line && Object.fromEntries(line.slice("node pids:".length).trim().split(" ").map((p) => p.split("=")));
      }, 120000);
    } catch (error) {
      if (!(error instanceof Fatal) || !/in use/i.test(devLog)) throw error;
      console.log(`- port base ${base} is taken (${devLog.split("\n").find((l) => /in use/i.test(l))}); trying another`);
    }
  }
  throw new Error(`every port base was taken: ${bases.join(", ")}`);
}

async function main() {
  const pids = await startDev();
  step(`cellfleet dev is up on port base ${base}: ${JSON.stringify(pids)}`);

  const keys = Array.from({ length: 12 }, (_, i) => `console-${i}`);
  for (const key of keys) await cli("exec", "kv", key, "put", "--arg", "key=k", "--arg", "value=1");
  step(`${keys.length} Cells written through the CLI`);

  browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  const errors = [];
  page.on("pageerror", (error) => errors.push(error.message));
  page.on("console", (message) => { if (message.type() === "error") errors.push(message.text()); });
  const console1 = `http://127.0.0.1:${base + 401}/ui/`;
  await page.goto(console1);
  await page.waitForFunction(() => document.querySelectorAll("#nodes tr[data-state=live]").length === 3, null, { timeout: 30000 });
  const served = await page.textContent("#served-by");
  if (served !== "served by n1") throw new Error(`the page says ${JSON.stringify(served)}, not "served by n1"`);
  step("the cluster page lists 3 live nodes");

  // Traffic while the page watches: the rates must show it.
  for (let round = 0; round < 3; round++) {
    for (const key of keys) await cli("query", "kv", key, "get", "--arg", "key=k");
    for (const key of keys.slice(0, 6)) await cli("exec", "kv", key, "put", "--arg", "key=k", "--arg", `value=${round + 2}`);
  }
  const rates = await until("a node row to show queries/s above 0", () => page.evaluate(() => {
    const cells = [...document.querySelectorAll("#nodes tbody tr")].map((row) => row.cells[7].textContent);
    return cells.some((text) => Number(text) > 0) && cells;
  }), 20000);
  step(`queries/s per node shown: ${rates.join(", ")}`);
  await page.screenshot({ path: join(artifacts, "console-cluster.png"), fullPage: true });

  await page.goto(`${console1}#/cells`);
  await page.waitForFunction((n) => document.querySelectorAll("#cells tbody tr").length >= n, keys.length, { timeout: 20000 });
  const rows = await page.$$eval("#cells tbody tr", (trs) => trs.map((tr) => ({ id: tr.dataset.cell, owner: tr.dataset.owner, key: tr.cells[2].textContent })));
  const target = rows.find((row) => row.owner !== "n1" && keys.includes(row.key));
  if (!target) throw new Error(`no Cell of ours owned by n2 or n3: ${JSON.stringify(rows)}`);
  const victim = target.owner;
  step(`the Cells page lists ${rows.length} Cells; ${target.key} is owned by ${victim}`);
  await page.fill("#search-q", target.key);
  await page.click("#cell-search button");
  await page.waitForFunction((key) => { const r = document.querySelectorAll("#cells tbody tr"); return r.length === 1 && r[0].cells[2].textContent === key; }, target.key, { timeout: 10000 });
  step("searching by key finds exactly that Cell");
  await page.screenshot({ path: join(artifacts, "console-cells.png"), fullPage: true });

  await page.goto(`${console1}#/cell/${target.id}`);
  const before = await until("the Cell page to show its root", () => page.evaluate(() => {
    const root = document.getElementById("cell-root");
    return root.dataset.epoch ? { owner: root.dataset.owner, epoch: Number(root.dataset.epoch) } : null;
  }), 10000);
  if (before.owner !== victim) throw new Error(`the Cell page says owner ${before.owner}, the Cells page said ${victim}`);
  step(`the Cell page shows owner ${before.owner} at epoch ${before.epoch}`);

  process.kill(Number(pids[victim]), "SIGKILL");
  step(`kill -9 ${victim} (pid ${pids[victim]})`);
  await page.goto(console1);
  await page.waitForSelector(`#nodes tr[data-node="${victim}"][data-state="expired"]`, { timeout: 30000 });
  step(`the cluster page shows ${victim}'s lease expired`);
  await page.screenshot({ path: join(artifacts, "console-node-expired.png"), fullPage: true });

  // The next command moves the Cell to a live node.
  await until(`a command on ${target.key} to succeed after the kill`, async () => {
    await cli("exec", "kv", target.key, "put", "--arg", "key=k", "--arg", "value=after");
    return true;
  }, 30000);
  await page.goto(`${console1}#/cell/${target.id}`);
  const after = await until("the Cell page to show a new owner at a later epoch", () => page.evaluate(({ victim, epoch }) => {
    const root = document.getElementById("cell-root");
    const now = { owner: root.dataset.owner, epoch: Number(root.dataset.epoch) };
    return now.owner && now.owner !== victim && now.epoch > epoch ? now : null;
  }, { victim, epoch: before.epoch }), 20000);
  step(`the Cell page shows owner ${after.owner} at epoch ${after.epoch} (was ${before.owner} at ${before.epoch})`);
  await page.screenshot({ path: join(artifacts, "console-cell.png"), fullPage: true });

  if (errors.length) throw new Error(`the page reported errors: ${errors.join(" | ")}`);
  await secure();
  console.log(`console browser test: ok (${steps.length} steps; screenshots in ${artifacts})`);
}

// `cellfleet dev --console-secure`: the console as `cellfleet node` serves
// it by default. A browser without a cluster-CA client certificate gets no
// page; with the dev client certificate it sees the node live.
async function secure() {
  const secureData = join(work, "secure");
  const secureBase = base + 500;
  secureDev = spawn(bin, ["dev", "--nodes", "1", "--data", secureData, "--port-base", String(secureBase), "--console-secure"], { env, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  secureDev.stdout.on("data", (chunk) => { log += chunk; });
  secureDev.stderr.on("data", (chunk) => { log += chunk; });
  await until("cellfleet dev --console-secure to report ready", () => {
    if (secureDev.exitCode !== null) throw new Fatal(`cellfleet dev --console-secure exited with ${secureDev.exitCode}: ${log}`);
    return log.includes("cluster ready");
  }, 120000);
  const origin = `https://127.0.0.1:${secureBase + 401}`;
  const anonymous = await browser.newContext({ ignoreHTTPSErrors: true });
  const refused = await anonymous.newPage().then((page) => page.goto(`${origin}/ui/`).then(() => "loaded", (error) => error.message));
  await anonymous.close();
  if (refused === "loaded") throw new Error("the secure console served a browser without a client certificate");
  step(`without a client certificate the secure console serves nothing (${refused.split("\n")[0]})`);
  const certs = join(secureData, "certs");
  const holder = await browser.newContext({
    ignoreHTTPSErrors: true,
    clientCertificates: [{ origin, certPath: join(certs, "client-dev.pem"), keyPath: join(certs, "client-dev.key") }],
  });
  const page = await holder.newPage();
  await page.goto(`${origin}/ui/`);
  await page.waitForSelector('#nodes tr[data-node="n1"][data-state="live"]', { timeout: 20000 });
  step("with the dev client certificate the secure console shows n1 live");
  await holder.close();
}

async function stop() {
  if (secureDev && secureDev.exitCode === null) {
    secureDev.kill("SIGTERM");
    await until("cellfleet dev --console-secure to drain", () => secureDev.exitCode !== null, 60000).catch(() => secureDev.kill("SIGKILL"));
  }
  if (browser) await browser.close().catch(() => {});
  if (dev && dev.exitCode === null) {
    dev.kill("SIGTERM");
    await until("cellfleet dev to drain", () => dev.exitCode !== null, 60000).catch(() => dev.kill("SIGKILL"));
  }
  rmSync(work, { recursive: true, force: true });
}

try {
  await main();
  await stop();
  process.exit(0);
} catch (error) {
  console.log(`console browser test FAILED: ${error.message}`);
  console.log(`after: ${steps.join("; ") || "no step"}`);
  console.log(`cellfleet dev output (last 3000 bytes):\n${devLog.slice(-3000)}`);
  await stop();
  process.exit(1);
}
