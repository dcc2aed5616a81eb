import ArgumentParser
import CofferProtocol
import CofferServerCore
import CofferServerHTTP
import Foundation
import Hummingbird
import Logging

@main
struct CofferServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer-server",
        abstract: "Serve Coffer accounts: encrypted metadata and content, nothing readable.",
        usage: "coffer-server --data <data> [<options>]\n       coffer-server invite --data <data> [--count <count>]",
        subcommands: [Invite.self])

    // Optional because `coffer-server invite` reads it too (ArgumentParser gives this command's
    // options to it wherever they appear); serving requires it (checked in `run`).
    @Option(help: "Directory for the database (metadata.sqlite) and chunks (required).")
    var data: String?

    @Option(help: "Address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "Port to listen on; 0 picks a free one (printed as `listening on http://HOST:PORT`).")
    var port: Int = 8080

    @Option(help: "Stored bytes allowed per account.")
    var quotaBytes: Int64 = CofferServer.defaultQuotaBytes

    @Option(
        help: ArgumentHelp(
            "Who may create accounts: open, invite (codes from `coffer-server invite`) or closed.",
            discussion: "Default: open when listening on loopback only, invite otherwise."))
    var registration: String?

    @Option(help: "Accounts one client address may create per minute (0: no limit).")
    var accountsPerMinute: Int = 10

    @Option(help: "Close a connection idle for this many seconds (1 to 86400).")
    var idleTimeoutSeconds: Int = CofferHTTP.Options.defaultIdleTimeoutSeconds

    @Option(help: "Open connections at most; more are closed on arrival.")
    var maxConnections: Int = CofferHTTP.Options.defaultMaxConnections

    @Option(help: "With --cleanup: keep unreferenced content younger than this many seconds.")
    var graceSeconds: Int64 = 0

    @Flag(help: "Check every account's tree, signatures and content references, print problems, then exit (1 if any).")
    var audit = false

    @Flag(help: "Remove content no current record references (left by interrupted uploads), then exit.")
    var cleanup = false

    @Option(help: "Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key.")
    var tlsCert: String?

    @Option(help: "The PEM private key of --tls-cert.")
    var tlsKey: String?

    @Option(help: "Log level (trace, debug, info, notice, warning, error, critical).")
    var logLevel: String = "info"

    func validate() throws {
        if let registration, CofferServer.RegistrationPolicy(rawValue: registration) == nil {
            throw ValidationError("--registration must be open, invite or closed")
        }
        guard (1...86_400).contains(idleTimeoutSeconds) else {
            throw ValidationError("--idle-timeout-seconds must be 1 to 86400")
        }
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        guard (0...(100 * 365 * 86_400)).contains(graceSeconds) else {
            throw ValidationError("--grace-seconds must be 0 to 100 years")
        }
    }

    func run() async throws {
        guard let data else { throw ValidationError("Missing expected argument '--data <data>'") }
        var logger = Logger(label: "coffer-server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        let server: CofferServer
        do {
            server = try CofferServer.open(
                directory: URL(fileURLWithPath: data, isDirectory: true), quotaBytes: quotaBytes,
                registration: registration.flatMap(CofferServer.RegistrationPolicy.init(rawValue:))
                    ?? Self.defaultRegistration(host: host))
        } catch {
            FileHandle.standardError.write(Data("coffer-server: cannot open \(data): \(error)\n".utf8))
            throw ExitCode(1)
        }
        if audit {
            let problems = try server.auditAll()
            for p in problems { FileHandle.standardOutput.write(Data("problem: \(p)\n".utf8)) }
            FileHandle.standardOutput.write(
                Data("audit: \(problems.isEmpty ? "clean" : "\(problems.count) problems")\n".utf8))
            if !problems.isEmpty { throw ExitCode(1) }
            return
        }
        if cleanup {
            let report = try server.cleanup(graceMillis: graceSeconds * 1000)
            FileHandle.standardOutput.write(
                Data(
                    ("cleanup: removed \(report.manifests) manifests, \(report.chunks) chunks, \(report.strayFiles) "
                        + "stray files\n").utf8))
            return
        }
        let host = self.host
        var options = CofferHTTP.Options(
            accountCreationsPerMinute: accountsPerMinute, idleTimeoutSeconds: idleTimeoutSeconds,
            maxConnections: maxConnections)
        switch (tlsCert, tlsKey) {
        case (nil, nil): break
        case (let cert?, let key?):
            do { options.tls = try CofferHTTP.tlsConfiguration(certificateFile: cert, keyFile: key) } catch {
                FileHandle.standardError.write(
                    Data("coffer-server: cannot load the TLS certificate or key: \(error)\n".utf8))
                throw ExitCode(1)
            }
        default:
            FileHandle.standardError.write(Data("coffer-server: --tls-cert and --tls-key go together\n".utf8))
            throw ExitCode(1)
        }
        let scheme = options.tls == nil ? "http" : "https"
        let app = try CofferHTTP.application(
            server: server, host: host, port: port, options: options, logger: logger,
            onRunning: { port in
                // Unbuffered, so a parent process reading the pipe sees it at once.
                FileHandle.standardOutput.write(Data("listening on \(scheme)://\(host):\(port)\n".utf8))
            })
        try await app.runService(gracefulShutdownSignals: [.sigterm, .sigint])
    }

    /// A server only this machine can reach is open; one others can reach needs invites unless
    /// its operator says otherwise (behind a reverse proxy on loopback, say so with
    /// `--registration`).
    static func defaultRegistration(host: String) -> CofferServer.RegistrationPolicy {
        API.isLoopback(host) ? .open : .invite
    }
}

/// `coffer-server invite --data DIR [--count N]`: prints new single-use invite codes, one a line.
struct Invite: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Make single-use invite codes for `--registration invite` (printed once; only their hashes are kept).",
        usage: "coffer-server invite --data <data> [--count <count>]")

    /// `--data` is the server command's own option (given after `invite` too).
    @ParentCommand var server: CofferServerCommand

    @Option(help: "How many codes to make.")
    var count: Int = 1

    func validate() throws {
        guard (1...10_000).contains(count) else { throw ValidationError("--count must be 1 to 10000") }
    }

    func run() throws {
        guard let data = server.data else { throw ValidationError("Missing expected argument '--data <data>'") }
        let store: CofferServer
        do {
            // Created if new, as the server would: invites can be made before its first start.
            store = try CofferServer.open(directory: URL(fileURLWithPath: data, isDirectory: true))
        } catch {
            FileHandle.standardError.write(Data("coffer-server: cannot open \(data): \(error)\n".utf8))
            throw ExitCode(1)
        }
        for code in try store.makeInvites(count: count) { print(code) }
    }
}
