'use strict';
// planlang for VS Code. Highlighting, comments, brackets and indentation are declarative (package.json,
// syntaxes/plan.tmLanguage.json, language-configuration.json); this file only runs the language server,
// `planlang lsp` over stdio, when the `planlang` executable can be found. Without it (or without the
// vscode-languageclient package) the extension logs one line to its output channel and stays a
// syntax-highlighting extension: no error pop-ups, nothing spawned.
const fs = require('fs');
const os = require('os');
const path = require('path');
const vscode = require('vscode');

const SECTION = 'planlang';
let client = null;
let output = null;

function log(message) {
    if (output) output.appendLine(message);
}

function isExecutableFile(file, platform) {
    try {
        if (!fs.statSync(file).isFile()) return false;
        if (platform !== 'win32') fs.accessSync(file, fs.constants.X_OK);
        return true;
    } catch (_err) {
        return false;
    }
}

// Where a project keeps planlang when it is not on PATH: the virtual environment in the workspace
// (./scripts/install.sh makes .venv), so the default setting needs no PATH and no configuration.
const VENV_DIRS = ['.venv', 'venv'];

function workspaceVenvExecutable(workspaceFolder, platform) {
    for (const dir of VENV_DIRS) {
        const file = platform === 'win32'
            ? path.join(workspaceFolder, dir, 'Scripts', 'planlang.exe')
            : path.join(workspaceFolder, dir, 'bin', 'planlang');
        if (isExecutableFile(file, platform)) return file;
    }
    return null;
}

/**
 * The absolute path of the planlang executable named by the `planlang.path` setting, or null.
 * A bare name is looked up on PATH (with PATHEXT on Windows), and the default name `planlang`, not found
 * there, in the first workspace folder's .venv or venv; a path may start with `~` or contain
 * `${workspaceFolder}`, and a relative path is taken from the first workspace folder.
 */
function findExecutable(setting, { env = process.env, platform = process.platform, workspaceFolder = null } = {}) {
    let name = (typeof setting === 'string' && setting.trim()) || 'planlang';
    const isDefault = name === 'planlang';
    if (workspaceFolder) name = name.split('${workspaceFolder}').join(workspaceFolder);
    if (name === '~' || name.startsWith('~/')) name = path.join(os.homedir(), name.slice(1));
    const exts = platform === 'win32'
        ? [''].concat((env.PATHEXT || '.COM;.EXE;.BAT;.CMD').split(';').filter(Boolean))
        : [''];
    const candidates = (base) => exts.map((ext) => base + ext);
    if (name.includes('/') || name.includes('\\')) {
        const base = path.isAbsolute(name) || !workspaceFolder ? path.resolve(name) : path.resolve(workspaceFolder, name);
        return candidates(base).find((f) => isExecutableFile(f, platform)) || null;
    }
    const dirs = (env.PATH || env.Path || '').split(path.delimiter).filter(Boolean);
    for (const dir of dirs) {
        const hit = candidates(path.join(dir, name)).find((f) => isExecutableFile(f, platform));
        if (hit) return hit;
    }
    return isDefault && workspaceFolder ? workspaceVenvExecutable(workspaceFolder, platform) : null;
}

function firstWorkspaceFolder() {
    const folders = vscode.workspace.workspaceFolders;
    return folders && folders.length ? folders[0].uri.fsPath : null;
}

// Model checks import the plan's model, which is Python code of the workspace: in a workspace the user has
// not trusted they stay off whatever the settings say (package.json also lists the setting under
// capabilities.untrustedWorkspaces.restrictedConfigurations, so a workspace cannot turn it on itself).
function trusted() {
    return vscode.workspace.isTrusted === true;
}

function isInside(file, folder) {
    const rel = path.relative(folder, file);
    return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel));
}

/** The `planlang` section as the server may see it: without model checks in an untrusted workspace. */
function serverSettings(values) {
    if (trusted() || !values || typeof values !== 'object') return values;
    return Object.assign({}, values, { modelChecks: false });
}

async function startClient() {
    const config = vscode.workspace.getConfiguration(SECTION);
    const setting = config.get('path', 'planlang');
    const folder = firstWorkspaceFolder();
    const exe = findExecutable(setting, { workspaceFolder: folder });
    if (!exe) {
        log(`planlang: executable "${setting}" not found; syntax highlighting only. ` +
            'Install planlang (on PATH, or in the workspace\'s .venv) or set "planlang.path".');
        return;
    }
    if (!trusted() && folder && isInside(exe, folder)) {
        // a program inside a workspace nobody has trusted yet is that workspace's code
        log(`planlang: ${exe} is inside the untrusted workspace; syntax highlighting only until it is trusted.`);
        return;
    }
    let lc;
    try {
        lc = require('vscode-languageclient/node');
    } catch (_err) {
        log('planlang: the vscode-languageclient package is missing (run `npm ci` in editors/vscode); ' +
            'syntax highlighting only.');
        return;
    }
    const serverOptions = { command: exe, args: ['lsp'], transport: lc.TransportKind.stdio };
    const clientOptions = {
        documentSelector: [{ scheme: 'file', language: 'plan' }, { scheme: 'untitled', language: 'plan' }],
        // The server reads these at start-up; later changes of the `planlang` section reach it as
        // workspace/didChangeConfiguration (synchronize.configurationSection).
        initializationOptions: {
            modelChecks: trusted() && config.get('modelChecks', false),
            modelCheckDelay: config.get('modelCheckDelay', 0.5),
        },
        synchronize: { configurationSection: SECTION },
        // Untrusted, a change is announced without its values (they would carry modelChecks), so the
        // server asks with workspace/configuration, whose answers leave model checks off.
        middleware: {
            workspace: {
                didChangeConfiguration: (sections, next) => next(trusted() ? sections : undefined),
                configuration: async (params, token, next) => {
                    const values = await next(params, token);
                    if (!Array.isArray(values)) return values;
                    return values.map((v, i) => {
                        const section = params.items[i] && params.items[i].section;
                        if (section === SECTION) return serverSettings(v);
                        if (section === `${SECTION}.modelChecks`) return trusted() && v;
                        return v;
                    });
                },
            },
        },
        outputChannel: output,
    };
    client = new lc.LanguageClient('planlang', 'planlang language server', serverOptions, clientOptions);
    log(`planlang: starting ${exe} lsp`);
    try {
        await client.start();
    } catch (err) {
        log(`planlang: the language server did not start: ${err && err.message ? err.message : err}`);
        client = null;
    }
}

async function stopClient() {
    const running = client;
    client = null;
    if (running) {
        try {
            await running.stop();
        } catch (_err) {
            // stopping a server that never started throws; there is nothing left to clean up
        }
    }
}

async function restartClient() {
    await stopClient();
    await startClient();
}

async function activate(context) {
    output = vscode.window.createOutputChannel('planlang');
    context.subscriptions.push(output);
    context.subscriptions.push(vscode.commands.registerCommand('planlang.restartServer', restartClient));
    // A new executable needs a new server; the server follows the other settings (modelChecks,
    // modelCheckDelay) itself, through didChangeConfiguration.
    context.subscriptions.push(vscode.workspace.onDidChangeConfiguration((event) => {
        if (event.affectsConfiguration('planlang.path')) return restartClient();
        return undefined;
    }));
    // trusted now: the settings (and an executable inside the workspace) apply in full
    if (vscode.workspace.onDidGrantWorkspaceTrust) {
        context.subscriptions.push(vscode.workspace.onDidGrantWorkspaceTrust(restartClient));
    }
    await startClient();
}

function deactivate() {
    return stopClient();
}

module.exports = { activate, deactivate, findExecutable, serverSettings };
