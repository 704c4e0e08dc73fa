package componenttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"
)

// fieldManager is the harness's own field manager, for what it writes under no other.
const fieldManager = "flotilla-componenttest"

// target is where a component's webhooks must point: the running manager, and which clientConfigs
// are the component's.
type target struct {
	namespace string          // a Service in it is the component's
	addr      string          // the running manager's webhook server
	ca        []byte          // its serving certificate's CA
	earlier   map[string]bool // webhook servers of the component's earlier managers
}

// owns reports whether cc belongs to the component: it names a Service in the component's
// namespace, or it points at one of the component's managers.
func (t *target) owns(cc *admissionv1.WebhookClientConfig) bool {
	if cc.Service != nil {
		return cc.Service.Namespace == t.namespace
	}
	if cc.URL != nil {
		u, err := url.Parse(*cc.URL)
		return err == nil && (u.Host == t.addr || t.earlier[u.Host])
	}
	return false
}

// pointed reports whether cc points at the running manager, trusting its CA.
func (t *target) pointed(cc *admissionv1.WebhookClientConfig) bool {
	if cc.Service != nil || cc.URL == nil || !bytes.Equal(cc.CABundle, t.ca) {
		return false
	}
	u, err := url.Parse(*cc.URL)
	return err == nil && u.Host == t.addr
}

// rewrite is envtest.WebhookInstallOptions' rewrite of a clientConfig: an https URL on the
// local server with the Service's path, and the CA bundle. A URL that points at an earlier
// manager keeps its path.
func (t *target) rewrite(svc *admissionv1.ServiceReference, rawURL *string) (newURL string) {
	p := "/"
	switch {
	case svc != nil && svc.Path != nil:
		p = *svc.Path
	case rawURL != nil:
		if u, err := url.Parse(*rawURL); err == nil && u.Path != "" {
			p = u.Path
		}
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return (&url.URL{Scheme: "https", Host: t.addr, Path: p}).String()
}

// clientConfigs returns the clientConfigs of a webhook configuration of either kind.
func clientConfigs(obj any) []*admissionv1.WebhookClientConfig {
	var out []*admissionv1.WebhookClientConfig
	switch c := obj.(type) {
	case *admissionv1.MutatingWebhookConfiguration:
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
	case *admissionv1.ValidatingWebhookConfiguration:
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
	}
	return out
}

// needsPointing reports whether a webhook of the component in obj does not point at its
// running manager.
func (t *target) needsPointing(obj any) bool {
	for _, cc := range clientConfigs(obj) {
		if t.owns(cc) && !t.pointed(cc) {
			return true
		}
	}
	return false
}

// point re-points the component's webhooks in every webhook configuration of the plane that has
// one not pointing at the running manager yet. The configurations are read live, so that a
// rewrite never undoes a newer write by Helm.
func (t *target) point(ctx context.Context, cs kubernetes.Interface) error {
	var errs []error
	mutating, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	for i := range mutating.Items {
		if c := &mutating.Items[i]; t.needsPointing(c) {
			errs = append(errs, t.pointMutating(ctx, cs, c))
		}
	}
	validating, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ValidatingWebhookConfigurations: %w", err)
	}
	for i := range validating.Items {
		if c := &validating.Items[i]; t.needsPointing(c) {
			errs = append(errs, t.pointValidating(ctx, cs, c))
		}
	}
	return errors.Join(errs...)
}

// allPointed reports whether every webhook of the component on the plane points at the running
// manager, and names one that does not.
func (t *target) allPointed(ctx context.Context, cs kubernetes.Interface) (bool, string, error) {
	mutating, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, "", fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	for i := range mutating.Items {
		if t.needsPointing(&mutating.Items[i]) {
			return false, "MutatingWebhookConfiguration " + mutating.Items[i].Name + " is not pointed at the manager yet", nil
		}
	}
	validating, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, "", fmt.Errorf("listing ValidatingWebhookConfigurations: %w", err)
	}
	for i := range validating.Items {
		if t.needsPointing(&validating.Items[i]) {
			return false, "ValidatingWebhookConfiguration " + validating.Items[i].Name + " is not pointed at the manager yet", nil
		}
	}
	return true, "", nil
}

// applier returns the field manager that applied (server-side) a clientConfig of the
// component's webhooks in obj, "" when none did. extract returns the fields a manager applied.
func (t *target) applier(fields []metav1.ManagedFieldsEntry, extract func(manager string) ([]*admissionv1ac.WebhookClientConfigApplyConfiguration, error)) (string, error) {
	for _, f := range fields {
		if f.Operation != metav1.ManagedFieldsOperationApply || f.Subresource != "" {
			continue
		}
		ccs, err := extract(f.Manager)
		if err != nil {
			return "", fmt.Errorf("extracting the fields of manager %s: %w", f.Manager, err)
		}
		for _, cc := range ccs {
			if cc != nil && (cc.Service != nil || cc.URL != nil) && t.ownsApplied(cc) {
				return f.Manager, nil
			}
		}
	}
	return "", nil
}

func (t *target) ownsApplied(cc *admissionv1ac.WebhookClientConfigApplyConfiguration) bool {
	plain := &admissionv1.WebhookClientConfig{URL: cc.URL}
	if cc.Service != nil {
		plain.Service = &admissionv1.ServiceReference{Namespace: deref(cc.Service.Namespace)}
	}
	return t.owns(plain)
}

// rewriteApplied rewrites an applied clientConfig of the component, leaving others alone.
func (t *target) rewriteApplied(cc *admissionv1ac.WebhookClientConfigApplyConfiguration) {
	if cc == nil || !t.ownsApplied(cc) {
		return
	}
	var svc *admissionv1.ServiceReference
	if cc.Service != nil {
		svc = &admissionv1.ServiceReference{Path: cc.Service.Path}
	}
	u := t.rewrite(svc, cc.URL)
	cc.Service, cc.URL, cc.CABundle = nil, &u, t.ca
}

// rewritePlain rewrites a clientConfig of the component in a live object.
func (t *target) rewritePlain(cc *admissionv1.WebhookClientConfig) {
	if !t.owns(cc) {
		return
	}
	u := t.rewrite(cc.Service, cc.URL)
	cc.Service, cc.URL, cc.CABundle = nil, &u, t.ca
}

func (t *target) pointMutating(ctx context.Context, cs kubernetes.Interface, c *admissionv1.MutatingWebhookConfiguration) error {
	api := cs.AdmissionregistrationV1().MutatingWebhookConfigurations()
	manager, err := t.applier(c.ManagedFields, func(m string) ([]*admissionv1ac.WebhookClientConfigApplyConfiguration, error) {
		ac, err := admissionv1ac.ExtractMutatingWebhookConfiguration(c, m)
		if err != nil {
			return nil, err
		}
		var out []*admissionv1ac.WebhookClientConfigApplyConfiguration
		for i := range ac.Webhooks {
			out = append(out, ac.Webhooks[i].ClientConfig)
		}
		return out, nil
	})
	if err != nil {
		return fmt.Errorf("re-pointing MutatingWebhookConfiguration %s: %w", c.Name, err)
	}
	if manager == "" {
		c = c.DeepCopy()
		for i := range c.Webhooks {
			t.rewritePlain(&c.Webhooks[i].ClientConfig)
		}
		if _, err := api.Update(ctx, c, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("re-pointing MutatingWebhookConfiguration %s: %w", c.Name, err)
		}
		return nil
	}
	ac, err := admissionv1ac.ExtractMutatingWebhookConfiguration(c, manager)
	if err != nil {
		return fmt.Errorf("re-pointing MutatingWebhookConfiguration %s: %w", c.Name, err)
	}
	for i := range ac.Webhooks {
		t.rewriteApplied(ac.Webhooks[i].ClientConfig)
	}
	if _, err := api.Apply(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
		return fmt.Errorf("re-pointing MutatingWebhookConfiguration %s as field manager %s: %w", c.Name, manager, err)
	}
	return nil
}

func (t *target) pointValidating(ctx context.Context, cs kubernetes.Interface, c *admissionv1.ValidatingWebhookConfiguration) error {
	api := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	manager, err := t.applier(c.ManagedFields, func(m string) ([]*admissionv1ac.WebhookClientConfigApplyConfiguration, error) {
		ac, err := admissionv1ac.ExtractValidatingWebhookConfiguration(c, m)
		if err != nil {
			return nil, err
		}
		var out []*admissionv1ac.WebhookClientConfigApplyConfiguration
		for i := range ac.Webhooks {
			out = append(out, ac.Webhooks[i].ClientConfig)
		}
		return out, nil
	})
	if err != nil {
		return fmt.Errorf("re-pointing ValidatingWebhookConfiguration %s: %w", c.Name, err)
	}
	if manager == "" {
		c = c.DeepCopy()
		for i := range c.Webhooks {
			t.rewritePlain(&c.Webhooks[i].ClientConfig)
		}
		if _, err := api.Update(ctx, c, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("re-pointing ValidatingWebhookConfiguration %s: %w", c.Name, err)
		}
		return nil
	}
	ac, err := admissionv1ac.ExtractValidatingWebhookConfiguration(c, manager)
	if err != nil {
		return fmt.Errorf("re-pointing ValidatingWebhookConfiguration %s: %w", c.Name, err)
	}
	for i := range ac.Webhooks {
		t.rewriteApplied(ac.Webhooks[i].ClientConfig)
	}
	if _, err := api.Apply(ctx, ac, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
		return fmt.Errorf("re-pointing ValidatingWebhookConfiguration %s as field manager %s: %w", c.Name, manager, err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
