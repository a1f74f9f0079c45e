/* SPDX-License-Identifier: ISC */
/*
 * t_service.h -- the service table t_service publishes as "t_service.v1" and
 * t_hooks looks up with api->service_lookup() (the plugin-to-plugin service
 * mechanism of the plugin ABI).
 */
#ifndef T_SERVICE_H
#define T_SERVICE_H

#define T_SERVICE_NAME "t_service.v1"

struct t_service_v1 {
	int version;			/* 1 */
	long (*answer)(void);		/* always 42 */
	long (*bump)(void);		/* a counter owned by t_service: returns the new value */
};

#endif
