'use strict';
// Runs editors/vscode/extension.js outside VS Code: `vscode` and `vscode-languageclient/node` are fakes
// that record what the extension does. One scenario per run:
//   node vscode_extension_harness.js '{"scenario": ..., "settings": {...}, "path": "...", "noClient": false}'
// prints {"clients": [...], "log": [...], "stopped": n, "error": null}. `untrusted`: the workspace is not
// trusted (vscode.workspace.isTrusted false) until `grantTrust`; `configurationAnswer`: what VS Code
// would answer the server's workspace/configuration request for `planlang`, passed through each
// client's middleware (its result, and the sections a didChangeConfiguration announces, are recorded).
const Module = require('module');
const path = require('path');

const args = JSON.parse(process.argv[2]);
const record = { clients: [], log: [], stopped: 0, error: null, commands: [] };
let configListener = null;
let trustListener = null;
const settings = Object.assign({}, args.settings || {});

const fakeVscode = {
    window: {
        createOutputChannel: () => ({ appendLine: (line) => record.log.push(line), dispose() {} }),
    },
    workspace: {
        workspaceFolders: args.workspaceFolder ? [{ uri: { fsPath: args.workspaceFolder } }] : undefined,
        getConfiguration: (section) => ({
            get: (key, fallback) => {
                const full = `${section}.${key}`;
                return Object.prototype.hasOwnProperty.call(settings, full) ? settings[full] : fallback;
            },
        }),
        onDidChangeConfiguration: (listener) => { configListener = listener; return { dispose() {} }; },
        isTrusted: !args.untrusted,
        onDidGrantWorkspaceTrust: (listener) => { trustListener = listener; return { dispose() {} }; },
    },
    commands: {
        registerCommand: (name, fn) => { record.commands.push(name); return { dispose() {} }; },
    },
};

const clients = [];

class FakeLanguageClient {
    constructor(id, name, serverOptions, clientOptions) {
        this.entry = { id, name, serverOptions, clientOptions: Object.assign({}, clientOptions, { outputChannel: undefined }), started: false };
        this.middleware = (clientOptions.middleware && clientOptions.middleware.workspace) || {};
        record.clients.push(this.entry);
        clients.push(this);
    }
    async probeMiddleware(answer) {
        const items = [{ section: 'planlang' }, { section: 'planlang.modelChecks' }, { section: 'editor' }];
        const values = [answer, answer.modelChecks, { tabSize: 4 }];
        const next = async () => values;
        this.entry.configuration = this.middleware.configuration
            ? await this.middleware.configuration({ items }, null, next) : values;
        let announced = 'not sent';
        const send = async (sections) => { announced = sections === undefined ? null : sections; };
        await (this.middleware.didChangeConfiguration
            ? this.middleware.didChangeConfiguration(['planlang'], send) : send(['planlang']));
        this.entry.announced = announced;
    }
    async start() {
        if (args.startFails) throw new Error('spawn failed');
        this.entry.started = true;
    }
    async stop() { record.stopped += 1; }
}
const fakeClientModule = { LanguageClient: FakeLanguageClient, TransportKind: { stdio: 0, ipc: 1, pipe: 2, socket: 3 } };

const originalLoad = Module._load;
Module._load = function load(request, parent, isMain) {
    if (request === 'vscode') return fakeVscode;
    if (request === 'vscode-languageclient/node') {
        if (args.noClient) throw new Error("Cannot find module 'vscode-languageclient/node'");
        return fakeClientModule;
    }
    return originalLoad.call(this, request, parent, isMain);
};

async function main() {
    if (args.PATH !== undefined) process.env.PATH = args.PATH;
    const extension = require(path.resolve(__dirname, '..', '..', 'editors', 'vscode', 'extension.js'));
    const context = { subscriptions: [] };
    await extension.activate(context);
    if (args.grantTrust) {
        fakeVscode.workspace.isTrusted = true;
        await trustListener();
    }
    if (args.changeSetting) {
        Object.assign(settings, args.changeSetting);
        const keys = Object.keys(args.changeSetting);
        await configListener({ affectsConfiguration: (k) => keys.includes(k) });
    }
    if (args.configurationAnswer) {
        for (const client of clients) await client.probeMiddleware(args.configurationAnswer);
    }
    if (args.deactivate) await extension.deactivate();
    if (args.findExecutable) {
        record.found = extension.findExecutable(args.findExecutable.setting, args.findExecutable.options);
    }
}

main()
    .catch((err) => { record.error = String(err && err.stack ? err.stack : err); })
    .finally(() => process.stdout.write(JSON.stringify(record)));
