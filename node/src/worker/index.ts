/**
 * The worker side of wirepool: register handlers on a {@link Worker} and `serve()`.
 * @module
 */
export { Worker, SDK_NAME, SDK_VERSION, type MethodOptions, type ServeOptions, type StreamHandler, type UnaryHandler, type WorkerOptions } from "./worker.js";
export { type Context, RequestCancelled, WorkerError } from "./context.js";
export { isLoopback, JoinRefused, parseTicket, Ticket, TicketError, TICKET_ENV, TICKET_FILE_ENV } from "./remote.js";
