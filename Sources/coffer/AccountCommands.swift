import ArgumentParser
import CofferCrypto
import CofferSync
import CofferVault
import Foundation

struct Init: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Create a new account and an empty encrypted tree.")
    @OptionGroup var store: StoreOptions
    @Argument(help: "Your username (letters, digits, '-', '_', '.').") var username: String
    @Option(
        help:
            "Register with this coffer-server (https://host:8443, or http://127.0.0.1:8080) and sync with it."
    ) var server: String?
    @OptionGroup var connection: ServerConnectionOptions
    @Flag(
        help:
            "Seal the account key on this device with a passphrase (asked twice, or read from $COFFER_PASSPHRASE_FILE)."
    )
    var passphrase = false
    @Option(help: "An invite code from the server's operator (for a server that registers by invite).") var invite:
        String?

    func run() throws {
        try guarded {
            let dir = store.resolvedDataDir
            let trusted = try server.map { try connection.checked($0) } ?? nil
            let vault = try Vault.create(
                dataDirectory: dir, username: username, passphrase: passphrase ? CLIPassphraseSource() : nil)
            if let server {
                do {
                    try vault.setServer(server, trustedCertificatePEM: trusted, insecureHTTP: connection.insecureHttp)
                    let engine = try SyncEngine.forStore(vault)
                    try runBlocking { [invite] in try await engine.register(invite: invite) }
                    try runBlocking { try await engine.sync() }
                } catch {
                    // Nothing half-applied: without the server account, the local one is removed too.
                    removeNewStore(dir)
                    throw error
                }
            }
            print(
                "Created account \(vault.username) in "
                    + "\(vault.dataDirectory)\(server.map { " (synced with \($0))" } ?? "")."
            )
            print("Back up your key now: `coffer account export --phrase` prints your 24-word recovery phrase.")
        }
    }
}

struct Account: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Export or import the account key.",
        subcommands: [ExportKey.self, ImportKey.self, SetPassphrase.self])

    struct ExportKey: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "export", abstract: "Print the account key (base64, or the 24-word phrase).")
        @OptionGroup var store: StoreOptions
        @Flag(help: "Print the 24-word recovery phrase instead of the base64 string.") var phrase = false

        func run() throws {
            try guarded {
                let vault = try store.openVault()
                let secret = vault.exportedSecret
                print(phrase ? secret.phrase.joined(separator: " ") : secret.base64)
            }
        }
    }

    struct ImportKey: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "import", abstract: "Restore an account from a phrase or base64 key read on stdin.")
        @OptionGroup var store: StoreOptions
        @Option(help: "Username for the restored tree (without --server).") var username: String = "coffer"
        @Option(help: "Join the account on this server and bring the whole tree down.") var server: String?
        @Flag(
            help: ArgumentHelp(
                "With --server: bring the tree's records only; content comes when a file is opened, or with `coffer "
                    + "pin` (docs/SYNC.md, \"Content on demand\")."))
        var onDemand = false
        @OptionGroup var connection: ServerConnectionOptions
        @Flag(
            help:
                "Seal the account key with a passphrase (asked twice, or read from $COFFER_PASSPHRASE_FILE)."
        )
        var passphrase = false

        func run() throws {
            try guarded {
                let trusted = try server.map { try connection.checked($0) } ?? nil
                let input = String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self)
                let secret = try AccountSecret(exported: input)
                let dir = store.resolvedDataDir
                let sealing = passphrase ? CLIPassphraseSource() : nil
                guard let server else {
                    if onDemand { throw CLIError("--on-demand joins from a server: give --server URL") }
                    let vault = try Vault.create(
                        dataDirectory: dir, username: username, secret: secret, passphrase: sealing)
                    print("Imported account \(vault.username) (\(vault.accountID)) into \(vault.dataDirectory).")
                    return
                }
                // The tree arrives with the first pull; the username is the server's.
                let vault = try Vault.create(
                    dataDirectory: dir, username: username, secret: secret, passphrase: sealing, createRoot: false)
                do {
                    try vault.setServer(server, trustedCertificatePEM: trusted, insecureHTTP: connection.insecureHttp)
                    if onDemand { try vault.setOnDemand(true) }
                    let probe = try SyncEngine.forStore(vault)
                    let bar = SyncProgressBar()
                    probe.onProgress { bar.show($0) }
                    let report = try runBlocking { try await probe.sync() }
                    bar.finish()
                    guard probe.vault.hasRoot else {
                        throw CLIError(
                            "the server has no tree for this account; create it with `coffer init NAME --server URL`")
                    }
                    print(
                        "Joined account \(probe.vault.username) (\(probe.vault.accountID)) from \(server): "
                            + "\(report.pulled) files" + (onDemand ? " (content on demand)." : ".")
                    )
                } catch {
                    removeNewStore(dir)
                    throw error
                }
            }
        }
    }

    struct SetPassphrase: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "passphrase",
            abstract: "Set, change or remove the passphrase that seals the account key on this device.",
            discussion: """
                Asks for the current passphrase (if there is one), then the new one twice. From a script,
                $COFFER_PASSPHRASE_FILE holds the current one and $COFFER_NEW_PASSPHRASE_FILE the new one
                (either file's first line). The passphrase protects this device's copy of the key only:
                `coffer account export` still prints the key itself.
                """)
        @OptionGroup var store: StoreOptions
        @Flag(help: "Store the account key without a passphrase again.") var remove = false

        func run() throws {
            try guarded {
                let source = CLIPassphraseSource()
                let dir = store.resolvedDataDir
                let protected = try Vault.accountKeyIsProtected(dataDirectory: dir)
                if remove && !protected {
                    print("The account key in \(dir) has no passphrase; nothing to remove.")
                    return
                }
                if !remove && protected && source.scriptGivesNoNewPassphrase {
                    throw CLIError(
                        "$\(CLIPassphraseSource.fileVariable) gives the current passphrase; put the new one in "
                            + "$\(CLIPassphraseSource.newFileVariable)"
                    )
                }
                let vault = try store.openVault()
                if remove {
                    try vault.protectAccountKey(with: nil)
                    print(
                        "Removed the passphrase: the account key in \(dir) is stored unsealed (readable by its owner "
                            + "only)."
                    )
                } else {
                    try vault.protectAccountKey(with: try source.newPassphrase())
                    print("\(protected ? "Changed" : "Set") the passphrase of the account key in \(dir).")
                }
            }
        }
    }
}

struct Whoami: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the account of this store.")
    @OptionGroup var store: StoreOptions

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            print("\(vault.username) (key \(vault.accountID))")
            print("fingerprint: \(KeyFingerprint.of(vault.accountID.bytes))")
        }
    }
}

struct Completions: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print a shell completion script (bash, zsh or fish).")
    @Argument(help: "bash, zsh or fish") var shell: String

    func run() throws {
        try guarded {
            guard let kind = CompletionShell(rawValue: shell) else {
                throw CLIError("unknown shell \"\(shell)\"; use bash, zsh or fish")
            }
            print(Coffer.completionScript(for: kind))
        }
    }
}

/// How to reach a server: a certificate to trust for it, and consent to plain HTTP beyond this
/// machine.
struct ServerConnectionOptions: ParsableArguments {
    @Option(help: "Trust this PEM certificate for the server (a self-signed one or a private CA).") var serverCa:
        String?
    @Flag(
        help:
            "Allow plain http:// beyond this machine (anyone on the path can then read and answer requests)."
    )
    var insecureHttp = false

    /// Checks the URL against the HTTP policy and reads the certificate, before anything is created.
    func checked(_ server: String) throws -> [UInt8]? {
        _ = try HTTPTransport.checkedURL(server, allowInsecureHTTP: insecureHttp)
        guard let serverCa else { return nil }
        guard let pem = FileManager.default.contents(atPath: serverCa) else {
            throw CLIError("cannot read \(serverCa)")
        }
        _ = try HTTPTransport(baseURL: server, trustedCertificatePEM: Array(pem))
        return Array(pem)
    }
}

/// Removes a store this command just created (its secret first, so a half-removed store is not
/// mistaken for an account).
func removeNewStore(_ dir: String) {
    for name in [
        "account.secret", "coffer.sqlite", "coffer.sqlite-wal", "coffer.sqlite-shm", "content.lock", "mount.lock",
    ] {
        unlink(dir + "/" + name)
    }
    rmdir(dir)
}

struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Sync with the server: pull, push, merge.")
    @OptionGroup var store: StoreOptions
    @Flag(help: "Also print the bytes and requests exchanged with the server.") var stats = false

    func run() throws {
        try guarded {
            let vault = try store.openVault()
            let engine = try SyncEngine.forStore(vault)
            let bar = SyncProgressBar()
            engine.onProgress { bar.show($0) }
            let report = try runBlocking { try await engine.sync() }
            bar.finish()
            if let n = report.resentToServer {
                print(
                    "note: the server was behind this device (restored from a backup?); re-sent \(n) "
                        + "file\(n == 1 ? "" : "s")"
                )
            }
            print(
                "synced: pulled \(report.pulled) records (\(report.fetchedChunks) chunks), pushed "
                    + "\(report.pushedRecords) records (\(report.pushedChunks) chunks)"
            )
            if report.removedLinks > 0 {
                print(
                    "removed \(report.removedLinks) link\(report.removedLinks == 1 ? "" : "s") to shares that are gone")
            }
            // The server sent records of shared files that no key holder with access wrote.
            for r in report.refusedShared { print("refused shared file \(r.id): \(r.reason)") }
            for r in report.refusedSharedPush { print("warning: \(r)") }
            for name in report.contactClashes {
                print(
                    "warning: another device of yours pinned other keys for \(name); this device keeps its own "
                        + "(compare fingerprints with \(name), then `coffer contacts forget` or `verify`)")
            }
            if let why = report.contactsFailure {
                print("warning: contacts not shared with your other devices: \(why)")
            }
            if stats {
                let t = engine.traffic
                print("traffic: \(t.requests) requests, \(t.sent) bytes sent, \(t.received) bytes received")
                print(
                    "steps: "
                        + report.steps.map { String(format: "%@ %.2f s", $0.step, $0.seconds) }.joined(separator: ", "))
            }
        }
    }
}
