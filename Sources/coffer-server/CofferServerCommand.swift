import ArgumentParser
import CofferServerCore
import CofferServerHTTP
import Foundation
import Hummingbird
import Logging

@main
struct CofferServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coffer-server",
        abstract: "Serve Coffer accounts: encrypted metadata and content, nothing readable.")

    @Option(help: "Directory for the database (metadata.sqlite) and chunks.")
    var data: String

    @Option(help: "Address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "Port to listen on; 0 picks a free one (printed as `listening on http://HOST:PORT`).")
    var port: Int = 8080

    @Option(help: "Stored bytes allowed per account.")
    var quotaBytes: Int64 = CofferServer.defaultQuotaBytes

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

    @Option(help: "Log level (trace, debug, info, notice, warning, error, critical).")
    var logLevel: String = "info"

    func validate() throws {
        guard (1...86_400).contains(idleTimeoutSeconds) else { throw ValidationError("--idle-timeout-seconds must be 1 to 86400") }
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        guard (0...(100 * 365 * 86_400)).contains(graceSeconds) else { throw ValidationError("--grace-seconds must be 0 to 100 years") }
    }

    func run() async throws {
        var logger = Logger(label: "coffer-server")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        let server: CofferServer
        do {
            server = try CofferServer.open(directory: URL(fileURLWithPath: data, isDirectory: true), quotaBytes: quotaBytes)
        } catch {
            FileHandle.standardError.write(Data("coffer-server: cannot open \(data): \(error)\n".utf8))
            throw ExitCode(1)
        }
        if audit {
            let problems = try server.auditAll()
            for p in problems { FileHandle.standardOutput.write(Data("problem: \(p)\n".utf8)) }
            FileHandle.standardOutput.write(Data("audit: \(problems.isEmpty ? "clean" : "\(problems.count) problems")\n".utf8))
            if !problems.isEmpty { throw ExitCode(1) }
            return
        }
        if cleanup {
            let report = try server.cleanup(graceMillis: graceSeconds * 1000)
            FileHandle.standardOutput.write(Data("cleanup: removed \(report.manifests) manifests, \(report.chunks) chunks, \(report.strayFiles) stray files\n".utf8))
            return
        }
        let host = self.host
        let app = CofferHTTP.application(
            server: server, host: host, port: port,
            options: .init(accountCreationsPerMinute: accountsPerMinute, idleTimeoutSeconds: idleTimeoutSeconds,
                           maxConnections: maxConnections), logger: logger,
            onRunning: { port in
                // Unbuffered, so a parent process reading the pipe sees it at once.
                FileHandle.standardOutput.write(Data("listening on http://\(host):\(port)\n".utf8))
            })
        try await app.runService(gracefulShutdownSignals: [.sigterm, .sigint])
    }
}
